"""Checkpoints of adapter fine-tuning (``finetune: Adapters``) that hold what trained, not the base.

A `vit fit` checkpoint of a LoRA run keeps, under ``state_dict``, the adapters, the head and whatever else trained
(and their EMA), and under ``checkpoint["vit"]["lora"]`` the adapters' settings and the base's identity:

    {"rank": 8, "alpha": 16.0, "targets": ["q", "v"], ..., "dora": false,
     "base": {"source": "base.safetensors", "path": "/abs/base.safetensors", "sha256": "…"}, "save_base": false}

``source`` is what ``pretrained`` said (a file or a tag), ``path`` the file it named (None for a tag), and
``sha256`` the hash of the base tensors the checkpoint leaves out (`vit.nn.lora.base_digest`). Loading finds the
base as ``pretrained`` did (the file where it was, else the source as given), checks the hash, and only then
completes the state dict. With ``save_base: true`` (or no ``pretrained``: a random base cannot be found again)
the checkpoint holds the whole network and ``base`` is None. Loading the base and merging the adapters is
`vit.checkpoints.weights.load_merged`'s (a LoRA checkpoint is pretrained weights too).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

from torch import Tensor

from vit._graveyard import moved_name
from vit.checkpoints.meta import META_KEY, STATE_PREFIXES, evaluated_weights
from vit.errors import UserValueError


def base_identity(source: str, digest: str) -> dict[str, Any]:
    """What names a base: ``source`` as ``pretrained`` gave it, the file it names (absolute), and the hash."""
    path = str(Path(source).resolve()) if Path(source).is_file() else None
    return {"source": str(source), "path": path, "sha256": digest}


def describe_base(base: dict[str, Any]) -> str:
    """The base in words: its tag or file, and its hash."""
    where = f"the file {base['path']}" if base.get("path") else f"the tag {base['source']!r}"
    return f"{where} (pretrained: {base['source']}, sha256 {base['sha256'][:16]}…)"


def held_names(state_dict: dict[str, Tensor], trained: Collection[str]) -> dict[str, Tensor]:
    """A classifier's state dict without the frozen base: only the ``trained`` parameters of each network."""
    keep = {prefix + name for prefix in STATE_PREFIXES for name in trained}
    return {k: v for k, v in state_dict.items() if k in keep or not k.startswith(STATE_PREFIXES)}


def completed(state_dict: dict[str, Tensor], base: dict[str, Tensor], prefixes: Collection[str]) -> dict[str, Tensor]:
    """The state dict with each network's missing entries (``prefixes``) taken from ``base`` (a network's own)."""
    full = dict(state_dict)
    for prefix in prefixes:
        for name, value in base.items():
            full.setdefault(prefix + name, value)
    return full


def base_to_resume(path: str | os.PathLike) -> str | None:
    """What ``pretrained`` should say to resume the checkpoint ``path`` when it holds adapters alone: its base's file,
    where that is, or its tag (None: no thin adapters, the base's file is gone, or ``path`` is unreadable). The base
    then loads before the checkpoint, as FSDP needs: it restores a checkpoint after sharding the model."""
    import torch

    from vit.checkpoints.io import SHARDED_META, is_sharded

    sharded = is_sharded(path)
    try:  # mmap: the small entries alone are read
        checkpoint = torch.load(Path(path, SHARDED_META) if sharded else path, map_location="cpu", weights_only=True,
                                mmap=True)
    except Exception:
        return None
    base = ((checkpoint.get(META_KEY) or {}).get("lora") or {}).get("base")
    if not base:
        return None
    if sharded:  # torch.distributed.checkpoint loads every key the model has, or fails
        raise UserValueError(f"{path} holds LoRA adapters without their base in shards, which FSDP cannot resume "
                             "(torch's distributed checkpoint loads the whole model or nothing): resume from a "
                             "state_dict_type: full checkpoint, or train with finetune.init_args.save_base: true. "
                             "It exports, predicts and serves as it is")
    if base.get("path"):
        return base["path"] if Path(base["path"]).is_file() else None
    return base["source"]


def export_adapters(checkpoint: dict[str, Any], where: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """`vit export --format adapters`: what trained (adapters, head and the rest that trained; the EMA copy when
    training kept one) as ``adapters.safetensors``, and ``adapter_config.json``: the adapters' settings, the base's
    identity, the model's name and config and the class names, for a user who keeps one base and many tasks."""
    from safetensors.torch import save_file

    from vit.nn.lora import is_adapter

    meta = checkpoint[META_KEY]
    if not meta.get("lora"):
        raise UserValueError(f"{where} holds no adapters: --format adapters needs a checkpoint of "
                             "finetune: Adapters")
    weights = evaluated_weights(checkpoint["state_dict"], meta.get("ema", False))
    if meta["lora"].get("base") is None:  # the whole network is in the file: keep what trained alone
        weights = {k: v for k, v in weights.items() if is_adapter(k) or k.split(".")[0] in ("head", "head_dist")}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, out / "adapters.safetensors")
    config = {**meta["lora"], **{k: meta.get(k) for k in ("model_name", "model_config", "class_names")}}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [out / "adapters.safetensors", out / "adapter_config.json"]


__all__ = ["STATE_PREFIXES", "base_identity", "base_to_resume", "completed", "describe_base", "export_adapters",
           "held_names"]


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # 0.1's load_base, load_merged, Loader (vit/_graveyard.py)
