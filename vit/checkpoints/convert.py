"""Upstream checkpoint layouts -> timm's ``VisionTransformer`` state-dict names (the names `vit` uses).

torchvision, the original ViT / big_vision .npz, DINOv2's own .pth, OpenAI CLIP, OpenCLIP's timm trunk, and
the ``gamma_1/2`` LayerScale of DeiT III and timm's Eva (DINOv3). `to_timm_names` detects which.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import Tensor

from vit.errors import UserValueError


def convert_torchvision(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """torchvision `VisionTransformer` names -> timm names (same tensor layouts)."""
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        new = key
        new = new.replace("class_token", "cls_token")
        new = new.replace("conv_proj.", "patch_embed.proj.")
        new = new.replace("encoder.pos_embedding", "pos_embed")
        new = new.replace("encoder.ln.", "norm.")
        new = new.replace("heads.head.", "head.")
        m = re.match(r"encoder\.layers\.encoder_layer_(\d+)\.(.*)", new)
        if m:
            i, rest = m.groups()
            rest = (
                rest.replace("ln_1.", "norm1.")
                .replace("ln_2.", "norm2.")
                .replace("self_attention.in_proj_weight", "attn.qkv.weight")
                .replace("self_attention.in_proj_bias", "attn.qkv.bias")
                .replace("self_attention.out_proj.", "attn.proj.")
                .replace("mlp.0.", "mlp.fc1.")
                .replace("mlp.3.", "mlp.fc2.")
                .replace("mlp.linear_1.", "mlp.fc1.")  # torchvision < 0.13 names
                .replace("mlp.linear_2.", "mlp.fc2.")
            )
            new = f"blocks.{i}.{rest}"
        out[new] = value
    return out


def convert_npz(w: dict[str, Tensor]) -> dict[str, Tensor]:
    """Original ViT / big_vision Flax names and layouts -> timm names and layouts.

    Flax kernels are (in, out) and attention kernels are split per head:
    query/key/value (C, heads, head_dim), out (heads, head_dim, C).
    """
    prefix = next(
        (p for p in ("", "opt/target/", "params/", "params/img/") if f"{p}embedding/kernel" in w), None
    )
    if prefix is None:
        raise UserValueError("not a ViT .npz: no 'embedding/kernel' array (looked under '', "
                         "'opt/target/', 'params/', 'params/img/')")
    big_vision = prefix.startswith("params/") or f"{prefix}pos_embedding" in w
    stacked = f"{prefix}Transformer/encoderblock/LayerNorm_0/scale" in w

    def get(name: str, idx: int | None = None) -> Tensor:
        if f"{prefix}{name}" not in w:
            raise KeyError(f"missing array {prefix}{name!r} in the .npz")
        t = w[f"{prefix}{name}"].float()
        return t[idx] if idx is not None else t

    out = {
        "patch_embed.proj.weight": get("embedding/kernel").permute(3, 2, 0, 1),  # HWIO -> OIHW
        "patch_embed.proj.bias": get("embedding/bias"),
        "cls_token": get("cls"),
        "pos_embed": get("pos_embedding" if big_vision else "Transformer/posembed_input/pos_embedding"),
        "norm.weight": get("Transformer/encoder_norm/scale"),
        "norm.bias": get("Transformer/encoder_norm/bias"),
    }
    if f"{prefix}head/kernel" in w:
        out["head.weight"] = get("head/kernel").T
        out["head.bias"] = get("head/bias")
    if out["pos_embed"].dim() == 2:
        out["pos_embed"] = out["pos_embed"][None]

    if stacked:
        depth = w[f"{prefix}Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
    else:
        pattern = re.compile(re.escape(prefix) + r"Transformer/encoderblock_(\d+)/")
        depth = 1 + max((int(m.group(1)) for k in w if (m := pattern.match(k))), default=-1)
    for i in range(depth):
        out |= _npz_block(get, i, stacked=stacked, big_vision=big_vision)
    return out


def _npz_block(get: Callable[[str, int | None], Tensor], i: int, *, stacked: bool, big_vision: bool
               ) -> dict[str, Tensor]:
    """Block ``i`` of a ViT .npz in timm's names; ``get(name, index)`` reads an array (of the stacked blocks, the
    ``index``-th row). big_vision numbers the attention and MLP modules from 0, the original ViT from 1."""
    mha, mlp, ln2 = (0, 0, 1) if big_vision else (1, 3, 2)
    b, idx = ("Transformer/encoderblock/", i) if stacked else (f"Transformer/encoderblock_{i}/", None)
    a = f"{b}MultiHeadDotProductAttention_{mha}/"
    qkv = [get(f"{a}{n}/kernel", idx) for n in ("query", "key", "value")]
    out = {
        f"blocks.{i}.norm1.weight": get(f"{b}LayerNorm_0/scale", idx),
        f"blocks.{i}.norm1.bias": get(f"{b}LayerNorm_0/bias", idx),
        f"blocks.{i}.attn.qkv.weight": torch.cat([k.flatten(1).T for k in qkv]),  # (3C, C)
        f"blocks.{i}.attn.qkv.bias": torch.cat(
            [get(f"{a}{n}/bias", idx).reshape(-1) for n in ("query", "key", "value")]
        ),
        f"blocks.{i}.attn.proj.weight": get(f"{a}out/kernel", idx).flatten(0, 1).T,  # (C, C)
        f"blocks.{i}.attn.proj.bias": get(f"{a}out/bias", idx),
        f"blocks.{i}.norm2.weight": get(f"{b}LayerNorm_{ln2}/scale", idx),
        f"blocks.{i}.norm2.bias": get(f"{b}LayerNorm_{ln2}/bias", idx),
    }
    for r in range(2):
        out[f"blocks.{i}.mlp.fc{r + 1}.weight"] = get(f"{b}MlpBlock_{mlp}/Dense_{r}/kernel", idx).T
        out[f"blocks.{i}.mlp.fc{r + 1}.bias"] = get(f"{b}MlpBlock_{mlp}/Dense_{r}/bias", idx)
    return out


def convert_layer_scale(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """DeiT III's and timm Eva's (DINOv3's) ``blocks.i.gamma_1/2`` -> ``ls1/2.gamma``; Eva's ``attn.q_bias`` and
    ``attn.v_bias`` -> one ``attn.qkv.bias`` with a zero key bias (a key bias shifts every score of a query
    by the same amount, so softmax ignores it: the outputs are the same)."""
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        if key.endswith("attn.v_bias") or key.endswith("attn.k_bias"):
            continue
        if key.endswith("attn.q_bias"):
            v = sd[key[:-len("q_bias")] + "v_bias"]
            out[key[:-len("q_bias")] + "qkv.bias"] = torch.cat([value, torch.zeros_like(value), v])
            continue
        out[re.sub(r"^(blocks\.\d+\.)gamma_([12])$", r"\1ls\2.gamma", key)] = value
    return out


def convert_dinov2(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """DINOv2's own .pth (facebookresearch/dinov2) -> timm names, as timm's ``_convert_dinov2``.

    ``mask_token`` (used only in pre-training) is dropped. With ``register_tokens`` the model is timm's
    ``no_embed_class`` layout: the cls row of ``pos_embed`` is folded into ``cls_token``, registers become
    ``reg_token``. SwiGLU's ``mlp.w12`` / ``mlp.w3`` (ViT-g) become ``mlp.fc1`` / ``mlp.fc2``."""
    sd = {k: v for k, v in sd.items() if k != "mask_token"}
    if "register_tokens" in sd:
        sd["reg_token"] = sd.pop("register_tokens")
        sd["cls_token"] = sd["cls_token"] + sd["pos_embed"][:, :1]
        sd["pos_embed"] = sd["pos_embed"][:, 1:]
    return {re.sub(r"\.mlp\.w12\.", ".mlp.fc1.", re.sub(r"\.mlp\.w3\.", ".mlp.fc2.", k)): v for k, v in sd.items()}


OPENAI_CLIP_NAMES = [  # (OpenAI's, timm's), applied in order
    ("conv1", "patch_embed.proj"), ("positional_embedding", "pos_embed"), ("transformer.resblocks.", "blocks."),
    ("ln_pre", "norm_pre"), ("ln_post", "norm"), ("ln_", "norm"), ("in_proj_", "qkv."), ("out_proj", "proj"),
    ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2"),
]


def convert_openai_clip(sd: dict[str, Tensor], prefix: str = "visual.") -> dict[str, Tensor]:
    """OpenAI CLIP's image tower (``visual.conv1``, ``ln_pre``, ``in_proj_``, ``proj``) -> timm names.

    The text tower is left out. ``visual.proj`` (D, embed) becomes the head, transposed, with a zero bias."""
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        if not key.startswith(prefix):
            continue
        key = key[len(prefix):]
        for theirs, ours in OPENAI_CLIP_NAMES:
            key = key.replace(theirs, ours)
        if key == "proj":
            out["head.weight"], out["head.bias"] = value.T, torch.zeros(value.shape[1])
        elif key == "class_embedding":
            out["cls_token"] = value.reshape(1, 1, -1)
        elif key == "pos_embed":
            out["pos_embed"] = value.unsqueeze(0)
        else:
            out[key] = value
    return out


def convert_open_clip(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """OpenCLIP's timm image tower (``visual.trunk.*``, its projection ``visual.head.proj``) -> timm names."""
    prefix = "module.visual.trunk." if any(k.startswith("module.visual.trunk.") for k in sd) else "visual.trunk."
    out = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    proj = sd.get(prefix.replace("trunk.", "head.proj.weight"))
    if proj is not None:
        out["head.weight"], out["head.bias"] = proj, torch.zeros(proj.shape[0])
    return out


def to_timm_names(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Detect the checkpoint's naming and convert it to timm's ``VisionTransformer`` names."""
    if any(k.endswith("embedding/kernel") for k in sd):
        return convert_npz(sd)
    if "class_token" in sd or "conv_proj.weight" in sd:
        return convert_torchvision(sd)
    for prefix in ("visual.", "module.visual."):
        if f"{prefix}class_embedding" in sd:
            return convert_openai_clip(sd, prefix)
    if any(k.startswith(("visual.trunk.", "module.visual.trunk.")) for k in sd):
        return convert_layer_scale(convert_open_clip(sd))
    if "mask_token" in sd:
        return convert_dinov2(sd)
    return convert_layer_scale(sd)
