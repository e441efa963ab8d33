"""What a pretrained source says its images went through: `pretrained_preprocessing`, which `vit fit` uses for
every DataModule option the config leaves unset (`vit.cli.main.follow_the_weights`): the data follows the weights.

    >>> values, origin = pretrained_preprocessing("vit_small_patch14_dinov2.lvd142m")
    >>> values["img_size"], values["mean"], values["crop_pct"]
    (518, (0.485, 0.456, 0.406), 1.0)

The record itself (`vit.preprocessing.Preprocessing`) is a floor module's; reading it out of timm's table, a `vit`
checkpoint or a hub folder's ``config.json`` is the checkpoints' business.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vit.checkpoints.hub import HF_HUB, hub_folder
from vit.checkpoints.io import read_checkpoint
from vit.checkpoints.meta import META_KEY
from vit.errors import UserError, WeightsUnavailableError


def pretrained_preprocessing(source: str, model_name: str | None = None) -> tuple[dict[str, Any], str] | None:
    """(the DataModule options a pretrained ``source`` implies, where they come from), or None when it says nothing.

    The options are ``DATA_KEYS``: ``img_size``, ``mean``, ``std``, ``crop_pct``, ``interpolation``. From:

    * a timm pretrained tag (``vit_small_patch14_dinov2.lvd142m``): ``timm.models.get_pretrained_cfg``, a table in
      timm (no download);
    * a `vit fit` or `vit pretrain` checkpoint: what its run used;
    * a timm hub folder, or a file inside one (the Hugging Face cache): its ``config.json``'s ``pretrained_cfg``;
      a shared model (``hf-hub:owner/name``): its folder in the cache (`vit.checkpoints.hub.hub_folder`);
    * any other weights file (timm's names, DINOv2's, OpenAI CLIP's, ...): timm's default tag of ``model_name``,
      the architecture the file is loaded into, as ``timm.data.resolve_data_config`` does for a model built by name.
    """
    if source.startswith(HF_HUB):
        try:
            return _from_hub_config(hub_folder(source))
        except WeightsUnavailableError:  # loading the weights says so, with the ways on
            return None
    path = Path(source)
    if path.exists():
        found = _from_vit_checkpoint(path) or _from_hub_config(path)
        if found:
            return found
        default = _from_timm(model_name) if model_name else None
        if default is None:
            return None
        values, origin = default
        return values, f"{origin}, the default of the architecture {model_name} ({path.name} names none of its own)"
    return _from_timm(source)


def _values(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The DataModule options of a timm ``pretrained_cfg`` dict."""
    return {"img_size": int(cfg["input_size"][-2]), "mean": tuple(float(m) for m in cfg["mean"]),
            "std": tuple(float(s) for s in cfg["std"]), "crop_pct": float(cfg["crop_pct"]),
            "interpolation": str(cfg["interpolation"])}


def _from_timm(name: str) -> tuple[dict[str, Any], str] | None:
    from timm.models import get_pretrained_cfg

    try:
        cfg = get_pretrained_cfg(name)
    except RuntimeError:  # timm's "Invalid pretrained tag" for a known architecture
        return None
    if cfg is None:
        return None
    return _values(cfg.to_dict()), f"timm's pretrained_cfg of {name.split('.')[0]}.{cfg.tag}"


def _from_vit_checkpoint(path: Path) -> tuple[dict[str, Any], str] | None:
    """What a `vit fit`/`vit pretrain` checkpoint's run used (read with mmap: the tensors stay on disk)."""
    if not path.is_file() or path.suffix.lower() not in (".ckpt", ".pt", ".pth"):
        return None
    try:
        meta = read_checkpoint(path, mmap=True).get(META_KEY)
    except UserError:  # not a zip-format torch file, or no dict: not a vit checkpoint
        return None
    if not isinstance(meta, dict) or "mean" not in meta:
        return None
    values = {"mean": tuple(meta["mean"]), "std": tuple(meta["std"])}
    values.update({k: meta[k] for k in ("crop_pct", "interpolation") if k in meta})
    img_size = (meta.get("model_config") or {}).get("img_size")
    if img_size:
        values["img_size"] = int(img_size[0] if isinstance(img_size, Sequence) else img_size)
    return values, f"the {meta.get('task', 'vit')} checkpoint {path.name}"


def _from_hub_config(path: Path) -> tuple[dict[str, Any], str] | None:
    """A timm hub folder's ``config.json`` ``pretrained_cfg`` (the folder, or a weights file in it)."""
    config = (path if path.is_dir() else path.parent) / "config.json"
    try:
        cfg = json.loads(config.read_text()).get("pretrained_cfg")
        return (_values(cfg), f"{config}'s pretrained_cfg") if cfg else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no file, or not timm's layout
        return None
