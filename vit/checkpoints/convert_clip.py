"""Two-tower checkpoints -> `vit.nn.clip.CLIP`'s names, and the configs their tensors imply.

OpenCLIP's native CLIP (also OpenAI's own names: ``visual.conv1``, ``transformer.resblocks``, ``ln_final``,
``text_projection``), OpenCLIP's timm-trunk towers with a custom text tower (SigLIP: ``visual.trunk.*``,
``text.*``), and transformers' ``CLIPModel`` / ``SiglipModel`` (``vision_model.*``, ``text_model.*``). The image
side goes through `vit.checkpoints.convert` to timm's names, the path the vision-only loads take.
"""

from __future__ import annotations

import math
import re

import torch
from torch import Tensor

from vit.checkpoints.convert import OPENAI_CLIP_NAMES, convert_layer_scale, convert_open_clip, convert_openai_clip
from vit.nn.clip import CLIPTextConfig
from vit.nn.configs import ViTConfig

HF_LAYER_NAMES = [  # transformers' encoder layer -> ours, in order
    ("layer_norm1.", "norm1."), ("layer_norm2.", "norm2."), ("self_attn.out_proj.", "attn.proj."),
]


def split_towers(sd: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
    """(image tower in timm's names with ``proj.weight``, text tower in ours, {logit_scale, logit_bias})."""
    sd = {k.removeprefix("module."): v for k, v in sd.items()}
    if any(k.startswith("text_model.") for k in sd):
        vision, text = hf_vision(sd), hf_text(sd)
    else:
        vision, text = open_clip_vision(sd), open_clip_text(sd)
    scalars = {k: sd[k].reshape(()) for k in ("logit_scale", "logit_bias") if k in sd}
    return vision, text, scalars


def open_clip_vision(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """OpenCLIP's image tower (OpenAI's names, or a timm trunk) -> timm's names; its projection as ``proj.weight``."""
    if "visual.class_embedding" in sd:
        out = convert_openai_clip(sd)
    else:
        out = convert_layer_scale(convert_open_clip(sd))
    out.pop("head.bias", None)  # the vision-only converters give the bias-free projection a zero bias
    if "head.weight" in out:
        out["proj.weight"] = out.pop("head.weight")
    return out


def open_clip_text(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """OpenCLIP's text tower (top-level OpenAI names, or under ``text.``) -> `TextTower`'s names."""
    prefix = "text." if "text.token_embedding.weight" in sd else ""
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        if not key.startswith(prefix) or key.startswith("visual.") or key in ("logit_scale", "logit_bias"):
            continue
        key = key[len(prefix):]
        if key == "text_projection":  # a (W, E) matrix: x @ P
            out["proj.weight"] = value.T
            continue
        key = key.replace("text_projection.", "proj.").replace("ln_final.", "norm.")
        if key.startswith("transformer.resblocks."):
            for theirs, ours in OPENAI_CLIP_NAMES:
                key = key.replace(theirs, ours)
        if key.startswith(("blocks.", "token_embedding.", "positional_embedding", "norm.", "proj.")):
            out[key] = value
    return out


def _hf_layers(sd: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """transformers' ``{prefix}encoder.layers.i`` -> our ``blocks.i`` (q, k, v joined into one qkv)."""
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        m = re.match(re.escape(prefix) + r"encoder\.layers\.(\d+)\.(.*)", key)
        if not m:
            continue
        i, rest = m.groups()
        if rest.startswith(("self_attn.k_proj", "self_attn.v_proj")):
            continue
        if rest.startswith("self_attn.q_proj."):
            kind = rest.rsplit(".", 1)[1]
            parts = [sd[f"{prefix}encoder.layers.{i}.self_attn.{n}_proj.{kind}"] for n in "qkv"]
            out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat(parts)
            continue
        for theirs, ours in HF_LAYER_NAMES:
            rest = rest.replace(theirs, ours)
        out[f"blocks.{i}.{rest}"] = value
    return out


def hf_text(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """transformers' ``text_model`` (and CLIP's model-level ``text_projection``) -> `TextTower`'s names."""
    p = "text_model."
    out = _hf_layers(sd, p) | {
        "token_embedding.weight": sd[f"{p}embeddings.token_embedding.weight"],
        "positional_embedding": sd[f"{p}embeddings.position_embedding.weight"],
        "norm.weight": sd[f"{p}final_layer_norm.weight"], "norm.bias": sd[f"{p}final_layer_norm.bias"],
    }
    for theirs in ("text_projection.weight", f"{p}head.weight", f"{p}head.bias"):  # CLIP's; SigLIP's with a bias
        if theirs in sd:
            out["proj." + theirs.rsplit(".", 1)[1]] = sd[theirs]
    return out


def hf_vision(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """transformers' ``vision_model`` (CLIP: class token, pre-norm, ``visual_projection``; SigLIP: patch bias, the
    attention-pool ``head``) -> timm's names."""
    p = "vision_model."
    out = _hf_layers(sd, p)
    pos = sd[f"{p}embeddings.position_embedding.weight"][None]  # (1, N, D)
    out |= {"patch_embed.proj.weight": sd[f"{p}embeddings.patch_embedding.weight"], "pos_embed": pos,
            "norm.weight": sd[f"{p}post_layernorm.weight"], "norm.bias": sd[f"{p}post_layernorm.bias"]}
    if f"{p}embeddings.patch_embedding.bias" in sd:
        out["patch_embed.proj.bias"] = sd[f"{p}embeddings.patch_embedding.bias"]
    if f"{p}embeddings.class_embedding" in sd:
        out["cls_token"] = sd[f"{p}embeddings.class_embedding"].reshape(1, 1, -1)
    if f"{p}pre_layrnorm.weight" in sd:  # transformers' spelling
        out |= {"norm_pre.weight": sd[f"{p}pre_layrnorm.weight"], "norm_pre.bias": sd[f"{p}pre_layrnorm.bias"]}
    if "visual_projection.weight" in sd:
        out["proj.weight"] = sd["visual_projection.weight"]
    h = f"{p}head."
    if f"{h}probe" in sd:  # SigLIP's attention pool: in_proj's rows are [q; k; v], timm's q and kv
        w, b, D = sd[f"{h}attention.in_proj_weight"], sd[f"{h}attention.in_proj_bias"], pos.shape[-1]
        out |= {"attn_pool.latent": sd[f"{h}probe"], "attn_pool.q.weight": w[:D], "attn_pool.q.bias": b[:D],
                "attn_pool.kv.weight": w[D:], "attn_pool.kv.bias": b[D:]}
        for theirs, ours in (("attention.out_proj", "proj"), ("layernorm", "norm"), ("mlp.fc1", "mlp.fc1"),
                             ("mlp.fc2", "mlp.fc2")):
            for kind in ("weight", "bias"):
                out[f"attn_pool.{ours}.{kind}"] = sd[f"{h}{theirs}.{kind}"]
    return out


def _depth(sd: dict[str, Tensor]) -> int:
    return 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))


def vision_config(sd: dict[str, Tensor], *, num_heads: int | None = None, act_layer: str = "gelu",
                  norm_eps: float = 1e-5) -> ViTConfig:
    """The image tower a timm-named state dict holds (heads: ``num_heads``, else CLIP's 64 channels a head)."""
    w = sd["patch_embed.proj.weight"]  # (D, C, p, p)
    D, patch, cls = w.shape[0], w.shape[-1], "cls_token" in sd
    side = math.isqrt(sd["pos_embed"].shape[1] - int(cls))
    pool = "map" if "attn_pool.latent" in sd else "token" if cls else "avg"
    return ViTConfig(
        img_size=side * patch, patch_size=patch, in_chans=w.shape[1], num_classes=0, embed_dim=D, depth=_depth(sd),
        num_heads=num_heads or D // 64, mlp_ratio=sd["blocks.0.mlp.fc1.weight"].shape[0] / D, class_token=cls,
        global_pool=pool, fc_norm=False if pool == "avg" else None, pre_norm="norm_pre.weight" in sd,
        act_layer=act_layer, norm_eps=norm_eps, proj_dim=sd["proj.weight"].shape[0] if "proj.weight" in sd else 0,
    )


def text_config(sd: dict[str, Tensor], *, num_heads: int | None = None, **flags: object) -> CLIPTextConfig:
    """The text tower a `TextTower`-named state dict holds; ``flags``: act_layer, norm_eps, causal, pool."""
    vocab, width = sd["token_embedding.weight"].shape
    return CLIPTextConfig(
        vocab_size=vocab, context_length=sd["positional_embedding"].shape[0], embed_dim=width,
        num_heads=num_heads or width // 64, depth=_depth(sd), mlp_ratio=sd["blocks.0.mlp.fc1.weight"].shape[0] / width,
        output_dim=sd["proj.weight"].shape[0] if "proj.weight" in sd else 0, proj_bias="proj.bias" in sd,
        **flags,  # type: ignore[arg-type]
    )
