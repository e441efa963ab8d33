"""Load a CLIP or SigLIP model, both towers, with its tokenizer and image preparation: `load_clip(source)`.

``source`` is an OpenCLIP checkpoint file (``open_clip_model.safetensors``, ``open_clip_pytorch_model.bin``,
a bare ``.pt``/``.bin``/``.safetensors``), OpenAI's CLIP ``.pt`` (a TorchScript archive), transformers'
``CLIPModel``/``SiglipModel`` weights, a folder holding one of those (laid out as the hub's timm/ repos:
``open_clip_config.json``, the weights, ``tokenizer.json`` or ``vocab.json`` + ``merges.txt``; or transformers'
``config.json`` + ``model.safetensors``), or a timm tag whose hub repo carries the OpenCLIP files
(``vit_base_patch16_clip_224.openai``, ``hf-hub:timm/ViT-B-16-SigLIP``), read from the Hugging Face cache.
The image tower's names go through `vit.checkpoints.convert` as the vision-only loads do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.checkpoints.convert_clip import split_towers, text_config, vision_config
from vit.checkpoints.hub import HF_HUB, cached_file, check_reachable, hub_cache, hub_repo
from vit.checkpoints.weights import QUICK_GELU_TAGS, SUFFIXES, read_state_dict
from vit.data.clip_text import TextTokenizer, load_tokenizer
from vit.errors import UserPathError, UserValueError, WeightsUnavailableError
from vit.nn.clip import CLIP
from vit.nn.configs import MODEL_CONFIGS, named_config
from vit.preprocessing import Preprocessing

log = logging.getLogger(__name__)

OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
OPENAI_MEAN, OPENAI_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
HF_ACTIVATIONS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


@dataclass
class LoadedCLIP:
    """What `load_clip` gives: the model (eval mode), its tokenizer, and the images' preparation."""

    model: CLIP
    tokenizer: TextTokenizer
    preprocessing: Preprocessing
    source: str


def load_clip(source: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> LoadedCLIP:
    """Both towers, ``logit_scale``/``logit_bias``, the tokenizer (from ``tokenizer``, else beside the weights)."""
    weights, config = locate(source)
    sd = read_weights(weights)
    vision, text, scalars = split_towers(sd)
    if not text:
        raise UserValueError(f"{weights} holds an image tower only (no text tower: a vision-only timm file?): "
                             "zero-shot needs the OpenCLIP file of the same weights (open_clip_model.safetensors)")
    hf = any(k.startswith("text_model.") for k in sd)
    siglip = "logit_bias" in scalars
    if not config and not hf and weights.suffix == ".pt" and "visual.class_embedding" in sd:
        config = {"model_cfg": {"quick_gelu": True}}  # OpenAI's own .pt files: trained with QuickGELU
    v_cfg, t_cfg = (_hf_configs if hf else _open_clip_configs)(vision, text, config, siglip, weights)
    model = CLIP(v_cfg, t_cfg, logit_bias=siglip)
    state = {f"visual.{k}": v for k, v in vision.items()} | {f"text.{k}": v for k, v in text.items()} | scalars
    _load(model, state, weights)
    tok = load_tokenizer(Path(tokenizer) if tokenizer else weights.parent, family=model.family,
                         context_length=t_cfg.context_length)
    return LoadedCLIP(model.eval(), tok, _preprocessing(config, weights, siglip), str(source))


def _open_clip_configs(vision: dict[str, Tensor], text: dict[str, Tensor], config: dict[str, Any], siglip: bool,
                       weights: Path) -> tuple[Any, Any]:
    """The towers' configs from OpenCLIP's ``model_cfg`` (quick_gelu, text_cfg flags), else the family's defaults."""
    cfg = config.get("model_cfg", config)
    text_cfg, vision_cfg = cfg.get("text_cfg", {}), cfg.get("vision_cfg", {})
    quick = cfg.get("quick_gelu", False) or (not cfg and any(t in weights.name.lower() for t in QUICK_GELU_TAGS))
    act = "quick_gelu" if quick else "gelu"
    pools = {"argmax": "eot", "last": "last"}
    pool_type = text_cfg.get("pool_type", "last" if siglip else "argmax")
    if pool_type not in pools:
        raise UserValueError(f"{weights}: text pooling {pool_type!r} is not supported (argmax, last)")
    t_cfg = text_config(text, num_heads=text_cfg.get("heads"), act_layer=act,
                        norm_eps=(text_cfg.get("norm_kwargs") or {}).get("eps", 1e-6 if siglip else 1e-5),
                        causal=not text_cfg.get("no_causal_mask", siglip), pool=pools[pool_type])
    timm_name = vision_cfg.get("timm_model_name")
    if timm_name in MODEL_CONFIGS:
        proj = vision["proj.weight"].shape[0] if "proj.weight" in vision else 0
        depth = 1 + max(int(k.split(".")[1]) for k in vision if k.startswith("blocks."))
        return named_config(timm_name, num_classes=0, proj_dim=proj, depth=depth), t_cfg
    trunk = any(k.startswith("attn_pool.") for k in vision) or "norm_pre.weight" not in vision  # timm's: eps 1e-6
    heads = vision_cfg["width"] // vision_cfg.get("head_width", 64) if "width" in vision_cfg else None
    return vision_config(vision, num_heads=heads, act_layer=act, norm_eps=1e-6 if trunk else 1e-5), t_cfg


def _hf_configs(vision: dict[str, Tensor], text: dict[str, Tensor], config: dict[str, Any], siglip: bool,
                weights: Path) -> tuple[Any, Any]:
    """The towers' configs from transformers' ``config.json`` (heads, activation, eps), else the family's defaults."""
    def flags(side: dict[str, Any]) -> dict[str, Any]:
        act = side.get("hidden_act", "gelu_pytorch_tanh" if siglip else "quick_gelu")
        if act not in HF_ACTIVATIONS:
            raise UserValueError(f"{weights}: activation {act!r} is not supported ({', '.join(HF_ACTIVATIONS)})")
        return {"num_heads": side.get("num_attention_heads"), "act_layer": HF_ACTIVATIONS[act],
                "norm_eps": side.get("layer_norm_eps", 1e-6 if siglip else 1e-5)}

    t_cfg = text_config(text, causal=not siglip, pool="last" if siglip else "eot",
                        **flags(config.get("text_config", {})))
    return vision_config(vision, **flags(config.get("vision_config", {}))), t_cfg


def _load(model: CLIP, state: dict[str, Tensor], weights: Path) -> None:
    """Copy every tensor, or name the keys that do not fit (nothing copied)."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = [f"{k}: file {tuple(v.shape)} vs model {tuple(own[k].shape)}" for k, v in state.items()
             if k in own and own[k].shape != v.shape]
    if missing or unexpected or wrong:
        show = lambda items: ", ".join(items[:8]) + (f", … ({len(items)} in all)" if len(items) > 8 else "")
        lines = [f"{weights} does not fit the CLIP/SigLIP model its tensors describe:"]
        lines += [f"  {what}: {show(items)}" for what, items in
                  (("missing", missing), ("unexpected", unexpected), ("shape mismatches", wrong)) if items]
        raise UserValueError("\n".join(lines))
    with torch.no_grad():
        model.load_state_dict(state)


def read_weights(path: Path) -> dict[str, Tensor]:
    """A checkpoint's tensors; OpenAI's ``.pt`` files are TorchScript archives, read as such."""
    if path.suffix == ".pt":
        try:
            return {k: v for k, v in torch.jit.load(str(path), map_location="cpu").state_dict().items()}
        except RuntimeError:  # not TorchScript: a plain torch.save file
            pass
    return read_state_dict(path)


def _preprocessing(config: dict[str, Any], weights: Path, siglip: bool) -> Preprocessing:
    """Mean, std and interpolation as the weights were trained: OpenCLIP's ``preprocess_cfg``, transformers'
    ``preprocessor_config.json``, else the family's (OpenAI's statistics for CLIP, 0.5 for SigLIP)."""
    pre = dict(config.get("preprocess_cfg") or {})
    hf = weights.parent / "preprocessor_config.json"
    if not pre and hf.is_file():
        values = json.loads(hf.read_text())
        pre = {"mean": values.get("image_mean"), "std": values.get("image_std")}
    mean = pre.get("mean") or ((0.5,) * 3 if siglip else OPENAI_MEAN)
    std = pre.get("std") or ((0.5,) * 3 if siglip else OPENAI_STD)
    return Preprocessing(mean=tuple(mean), std=tuple(std), crop_pct=1.0,
                         interpolation=pre.get("interpolation", "bicubic"))


# ---------------------------------------------------------------------------- finding the files


def locate(source: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """(the weights file, its config as a dict, {} if none) for a file, a folder or a timm tag."""
    path = Path(source)
    if not str(source).startswith(HF_HUB) and (path.exists() or os.sep in str(source) or path.suffix in SUFFIXES):
        if path.is_dir():
            found = [path / n for n in OPEN_CLIP_WEIGHTS + HF_WEIGHTS if (path / n).is_file()]
            if not found:
                raise UserPathError(f"{path}: a folder without {' or '.join(OPEN_CLIP_WEIGHTS + HF_WEIGHTS)}")
            path = found[0]
        if not path.is_file():
            raise UserPathError(f"checkpoint not found: {path}")
        return path, _config_beside(path)
    return locate(hub_folder(str(source)))


def _config_beside(path: Path) -> dict[str, Any]:
    name = "config.json" if path.name in HF_WEIGHTS else "open_clip_config.json"
    config = path.parent / name
    return json.loads(config.read_text()) if config.is_file() else {}


def hub_folder(tag: str) -> Path:
    """The cached (else downloaded) snapshot folder of a tag's hub repo with its OpenCLIP weights and tokenizer."""
    name = tag.removeprefix(HF_HUB)
    if not tag.startswith(HF_HUB) and not any(f in name.lower() for f in ("clip", "siglip")):
        raise UserValueError(f"{tag!r} has no text tower (an image-only model): zero-shot needs CLIP or SigLIP "
                             "weights, e.g. vit_base_patch16_clip_224.openai or vit_base_patch16_siglip_224.webli")
    try:
        repo = hub_repo(tag)
    except Exception:  # timm does not know the name
        repo = None
    if repo is None:
        raise UserPathError(f"{tag!r} is neither a file, a folder nor a timm tag published on the hub")
    repo_id, revision = repo
    cached = cached_file(repo_id, revision, OPEN_CLIP_WEIGHTS)
    if cached:
        return Path(cached).parent
    check_reachable(tag, repo_id)
    return _download(tag, repo_id, revision)


def _download(tag: str, repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    get = lambda f: Path(hf_hub_download(repo_id, f, revision=revision, cache_dir=hub_cache()))
    for filename in OPEN_CLIP_WEIGHTS:
        try:
            folder = get(filename).parent
            break
        except EntryNotFoundError:
            continue
    else:
        raise WeightsUnavailableError(f"{repo_id} has no {' or '.join(OPEN_CLIP_WEIGHTS)}: {tag!r} carries no text "
                                      "tower on the hub")
    for filename in ("open_clip_config.json", *TOKENIZER_FILES):
        with contextlib.suppress(EntryNotFoundError):  # tokenizer files differ between repos
            get(filename)
    return folder
