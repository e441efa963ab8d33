"""Load real pretrained checkpoints (timm, torchvision, big_vision .npz, DINOv2, OpenAI CLIP, OpenCLIP,
DeiT III) into a `VisionTransformer`: `load_pretrained`, from a file, a hub folder or a tag whose file
`vit.checkpoints.hub` finds (the cache, else the hub).

Every format is converted to timm's state-dict names (`vit.checkpoints.convert`), the names our model uses, then
adapted to the model: a different head is left freshly initialised, a different patch grid
resamples ``pos_embed``, a different input channel count is folded. Anything else that does
not match is an error that lists the missing and unexpected keys, and the model is untouched.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from vit._graveyard import moved_name
from vit.checkpoints import hub
from vit.checkpoints.convert import to_timm_names
from vit.checkpoints.hub import cached_file, check_reachable, hub_repo, hub_weights
from vit.checkpoints.lora import describe_base
from vit.checkpoints.meta import EMA_PREFIX, META_KEY, MODEL_PREFIX, evaluated_weights
from vit.errors import UserError, UserPathError, UserValueError, WeightsUnavailableError
from vit.nn.lora import LoraConfig, add_adapters, base_digest, base_layers, init_magnitudes, merge_adapters
from vit.nn.vision import VisionTransformer, build_model, resample_pos_embed

log = logging.getLogger(__name__)

PICKLE_SUFFIXES = {".pth", ".pt", ".bin", ".ckpt"}
SUFFIXES = PICKLE_SUFFIXES | {".safetensors", ".npz"}
FRESH_HEAD = "the head stays freshly initialised"


@dataclass
class LoadResult:
    """What `load_pretrained` did beyond copying tensors."""

    source: str
    head_reset: bool = False
    pos_embed_resampled: bool = False
    notes: list[str] = field(default_factory=list)
    fresh: list[str] = field(default_factory=list)  # key prefixes left freshly initialised on purpose


# ---------------------------------------------------------------------------- reading


def weights_file(path: str | os.PathLike) -> Path:
    """The checkpoint file ``path`` names (a hub folder: its weights file), or an error naming what is missing."""
    path = Path(path)
    if path.is_dir():
        found = [path / name for name in hub.HUB_WEIGHTS if (path / name).is_file()]
        if not found:
            raise UserPathError(f"{path}: a folder without {' or '.join(hub.HUB_WEIGHTS)}")
        path = found[0]
    if not path.is_file():
        raise UserPathError(f"checkpoint file not found: {path}")
    return path


def read_state_dict(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read a checkpoint file (or a hub folder's weights) into a flat {name: tensor} dict, in the file's naming."""
    path = weights_file(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                return {k: torch.from_numpy(np.array(npz[k])) for k in npz.files}
        if suffix in PICKLE_SUFFIXES:
            obj = torch.load(path, map_location="cpu", weights_only=True)
            return _unwrap(obj, path)
    except pickle.UnpicklingError as e:
        raise UserValueError(
            f"{path}: refused to unpickle (weights_only=True allows tensors and plain containers "
            f"only): {e}"
        ) from e
    except UserValueError:  # _unwrap's own message
        raise
    except Exception as e:  # a corrupt file fails in each library's own way; name the file
        raise UserValueError(f"{path}: not a readable {suffix} checkpoint ({type(e).__name__}: {e})") from e
    raise UserValueError(
        f"{path}: unknown checkpoint suffix {suffix!r}; expected one of {', '.join(sorted(SUFFIXES))}"
    )


def _unwrap(obj: object, path: Path) -> dict[str, Tensor]:
    """Find the state dict inside the containers that training scripts save."""
    meta = obj.get(META_KEY) if isinstance(obj, dict) else None
    if isinstance(meta, dict) and meta.get("model_source") == "timm":  # a backbone: timm checkpoint
        raise UserValueError(f"{path} holds timm's {meta.get('model_name')}, a convnet (configs/teacher_small.yaml "
                             "trains one): a ViT's pretrained weights come from a ViT. A convnet teaches a ViT "
                             "through distillation instead: configs/distill_small.yaml, model.init_args.teacher")
    if isinstance(meta, dict) and meta.get("lora"):  # adapters (finetune: Adapters): the merged weights
        return merged_weights(obj, path)
    for key in ("state_dict", "model", "module", "model_state"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise UserValueError(f"{path}: expected a state dict of tensors, found {type(obj).__name__}")
    # Lightning prefixes the model's keys with its attribute name, DDP with 'module.'. A `vit fit`
    # checkpoint with EMA holds both copies; the EMA weights are the ones it validated and tested.
    for prefix in (EMA_PREFIX, MODEL_PREFIX, "module."):
        inner = {k[len(prefix):]: v for k, v in obj.items() if k.startswith(prefix)}
        if inner and any(k.startswith("blocks.") or k.startswith("encoder.") for k in inner):
            return inner
    return obj


def merged_weights(checkpoint: dict, path: Path) -> dict[str, Tensor]:
    """A LoRA or DoRA `vit fit` checkpoint's evaluated weights with the adapters merged (its base found first)."""
    meta = checkpoint[META_KEY]
    model = build_model(meta["model_config"])
    load_merged(model, evaluated_weights(checkpoint["state_dict"], meta.get("ema", False)), meta["lora"], path)
    return model.state_dict()


# ---------------------------------------------------------------------------- adapters on their base
# Here, not in `vit.checkpoints.lora`: a LoRA checkpoint's base loads as any pretrained weights do, and a LoRA
# checkpoint is itself pretrained weights that `read_state_dict` merges. One recursion, kept in one module.

Loader = Callable[[nn.Module, str], Any]  # a backbone's own way to load a source (`load_pretrained` by default)


def load_base(model: nn.Module, base: dict[str, Any], held: Collection[str], where: str | os.PathLike,
              loader: Loader | None = None) -> None:
    """Load the base ``base`` names into ``model`` (with its adapters) and check its hash against the one the
    checkpoint ``where`` recorded; ``held``: the names the checkpoint holds itself (left out of the hash);
    ``loader``: how the task's backbone loads weights (None: `load_pretrained`)."""
    found = base["path"] if base.get("path") and Path(base["path"]).is_file() else base["source"]
    try:
        with base_layers(model):
            if loader is None:  # the head loads from the checkpoint next: say so, not "freshly initialised"
                load_pretrained(model, found, head_from=str(where))
            else:
                loader(model, found)
    except (UserError, FileNotFoundError) as error:
        raise UserPathError(f"{where} holds LoRA adapters on {describe_base(base)}, which cannot be loaded here "
                            f"({str(error).splitlines()[0]}). Put that file back, or train with "
                            "finetune.init_args.save_base: true for a self-contained checkpoint") from None
    init_magnitudes(model)
    digest = base_digest(model.state_dict(), held)
    if digest != base["sha256"]:
        raise UserValueError(f"{where} holds LoRA adapters trained on {describe_base(base)}, but {found} now holds "
                             f"other weights (sha256 {digest[:16]}…): give the base it was trained on")


def load_merged(model: nn.Module, weights: dict[str, Tensor], lora: dict[str, Any], where: str | os.PathLike) -> None:
    """A LoRA or DoRA checkpoint's evaluated ``weights`` into the plain ``model``, merged: the base its ``lora``
    entry names loaded and checked first, unless the checkpoint holds it. ``model`` ends with plain layers."""
    add_adapters(model, LoraConfig.from_dict(lora))
    if lora.get("base"):
        load_base(model, lora["base"], weights, where)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or (missing and not lora.get("base")):
        raise UserValueError(f"{where}: its adapters do not fit its model (unexpected {unexpected[:3]}, missing "
                             f"{missing[:3]})")
    merge_adapters(model)


# ---------------------------------------------------------------------------- adapting


def _adapt(sd: dict[str, Tensor], model: VisionTransformer, result: LoadResult) -> dict[str, Tensor]:
    """Fit a timm-named state dict to this model's head, grid and input channels."""
    own = model.state_dict()
    sd = dict(sd)

    w = sd.get("patch_embed.proj.weight")
    target = own["patch_embed.proj.weight"]
    if w is not None and w.shape[1] != target.shape[1] and w.shape[2:] == target.shape[2:]:
        if target.shape[1] == 1:  # RGB weights for a grayscale model: sum the channels
            sd["patch_embed.proj.weight"] = w.sum(dim=1, keepdim=True)
        elif w.shape[1] == 1:
            sd["patch_embed.proj.weight"] = w.repeat(1, target.shape[1], 1, 1) / target.shape[1]
        result.notes.append(f"adapted patch embedding from {w.shape[1]} to {target.shape[1]} input channels")

    pos = sd.get("pos_embed")
    own_pos = own.get("pos_embed")
    if pos is not None and own_pos is not None and pos.shape != own_pos.shape and pos.shape[-1] == own_pos.shape[-1]:
        prefix = model.pos_embed_prefix  # the model's own layout: 0 rows for prefix tokens with no_embed_class
        n_old = pos.shape[1] - prefix
        side = math.isqrt(n_old)
        if side * side == n_old:
            sd["pos_embed"] = resample_pos_embed(pos, model.patch_embed.grid_size, (side, side), prefix)
            result.pos_embed_resampled = True
            result.notes.append(
                f"resampled pos_embed from a {side}x{side} to a "
                f"{model.patch_embed.grid_size[0]}x{model.patch_embed.grid_size[1]} patch grid"
            )

    if (any(k.startswith("norm.") for k in sd) and not any(k.startswith("fc_norm.") for k in sd)
            and "fc_norm.weight" in own and "norm.weight" not in own):
        # MAE's rule (facebookresearch/mae main_finetune.py, global_pool): an average-pooling model normalises
        # after pooling, so the encoder's final `norm` has no place in it: dropped, `fc_norm` starts fresh.
        for k in [k for k in sd if k.startswith("norm.")]:
            del sd[k]
        result.fresh.append("fc_norm.")
        result.notes.append("average pooling: the checkpoint's final norm.* is dropped and fc_norm starts fresh "
                            "(ones, zeros), as MAE's fine-tuning does")

    head_keys = [k for k in sd if k.startswith(("head.", "head_dist."))]
    if not head_keys and any(k.startswith("head.") for k in own):  # an encoder alone (MAE's, timm's num_classes=0)
        result.head_reset = True
        result.notes.append(f"the checkpoint has no classifier head (a pre-trained encoder): {FRESH_HEAD}")
    elif head_keys and any(k not in own or own[k].shape != sd[k].shape for k in head_keys):
        n_ckpt = sd["head.weight"].shape[0] if "head.weight" in sd else "?"
        for k in head_keys:
            del sd[k]
        result.head_reset = True
        result.notes.append(
            f"checkpoint head has {n_ckpt} classes, model has {model.num_classes}: {FRESH_HEAD}"
        )
    return sd


def _check(sd: dict[str, Tensor], model: VisionTransformer, result: LoadResult) -> None:
    own = model.state_dict()
    fresh = tuple(result.fresh) + (("head.", "head_dist.") if result.head_reset else ())
    missing = [k for k in own if k not in sd and not (fresh and k.startswith(fresh))]
    unexpected = [k for k in sd if k not in own]
    wrong = [
        f"{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sd
        if k in own and sd[k].shape != own[k].shape
    ]
    if missing or unexpected or wrong:

        def show(items: list[str]) -> str:
            return ", ".join(items[:12]) + (f", … ({len(items)} in all)" if len(items) > 12 else "")

        lines = [f"checkpoint {result.source} does not fit this model:"]
        if missing:
            lines.append(f"  missing keys: {show(missing)}")
        if unexpected:
            lines.append(f"  unexpected keys: {show(unexpected)}")
        if wrong:
            lines.append(f"  shape mismatches: {show(wrong)}")
        lines.append("Check that the model config (patch size, width, depth, pooling) matches it.")
        raise UserValueError("\n".join(lines))


# ---------------------------------------------------------------------------- public


def _from_timm_hub(name: str) -> dict[str, Tensor]:
    """The weights of a timm pretrained name or a shared model (``hf-hub:owner/name``), in timm's names: the hub's
    file (`vit.checkpoints.hub.hub_weights`), else, for weights timm publishes elsewhere, ``timm.create_model``'s."""
    found = hub_weights(name)
    return read_state_dict(found) if found else _from_timm_create_model(name)


def check_available(source: str | os.PathLike) -> None:
    """Raise now what `load_pretrained` would raise for weights it cannot get, without reading them: a missing
    file, a hub folder without weights, or a timm name neither in the cache nor reachable. Lets a command fail
    before its slow imports."""
    if _names_a_file(source):
        weights_file(source)
        return
    if str(source).startswith(hub.HF_HUB):
        hub.hub_folder(str(source))
        return
    repo = hub_repo(str(source))  # unknown names and weights outside the hub: left to load_pretrained
    if repo is not None and cached_file(*repo) is None:
        check_reachable(str(source), repo[0])


def _names_a_file(source: str | os.PathLike) -> bool:
    """A checkpoint file or hub folder, rather than a timm pretrained name or a shared model (hf-hub:)."""
    if str(source).startswith(hub.HF_HUB):
        return False
    path = Path(source)
    return path.suffix.lower() in SUFFIXES or path.exists() or os.sep in str(source)


def _from_timm_create_model(name: str) -> dict[str, Tensor]:
    import timm

    try:
        return timm.create_model(name, pretrained=True).state_dict()
    except Exception as e:  # any network or hub failure gets the same advice
        raise WeightsUnavailableError(
            f"could not fetch timm pretrained weights {name!r} ({type(e).__name__}: {e}).\n"
            "Without network access, download the checkpoint on a connected machine and pass the local file "
            "instead (--model.init_args.pretrained path/to/model.safetensors), or "
            "train from scratch with the recipe made for it: vit fit --config configs/scratch_small.yaml "
            "(--model.init_args.pretrained null keeps this recipe's fine-tuning lr, which random weights learn "
            "little from)."
        ) from e


QUICK_GELU_TAGS = (".openai", "metaclip")  # weights trained with QuickGELU (timm's own tags for them included)


def warn_quick_gelu(sd: dict[str, Tensor], model: VisionTransformer, source: str) -> None:
    """Warn when QuickGELU-trained weights (OpenAI CLIP, MetaCLIP) go into a GELU model: it runs, and its features
    are quietly wrong (timm #1754, #2031; open_clip #771)."""
    act = getattr(getattr(model, "config", None), "act_layer", "gelu")
    native = any(f"{p}class_embedding" in sd for p in ("visual.", "module.visual.")) or any(
        tag in source.lower() for tag in QUICK_GELU_TAGS)
    if native and act != "quick_gelu":
        name = Path(source).name.split(".")[0]
        fix = (name.replace("_clip_", "_clip_quickgelu_") if "_clip_" in name and "quickgelu" not in name
               else "the matching *_clip_quickgelu_* architecture (e.g. vit_base_patch16_clip_quickgelu_224)")
        log.warning("%s: these weights were trained with QuickGELU, but the model uses %s: its features will be "
                    "wrong. Build %s instead (or pass act_layer='quick_gelu').", source, act, fix)


def load_pretrained(model: VisionTransformer, source: str | os.PathLike, *, head_from: str | None = None) -> LoadResult:
    """Load a checkpoint file (.safetensors, .pth, .bin, .npz), a hub folder or a timm pretrained name.

    timm, torchvision and big_vision/original-ViT layouts are recognised. A head of another
    size stays freshly initialised, another patch grid resamples ``pos_embed``; any other
    mismatch raises ``ValueError`` before a single weight is changed. ``head_from``: the file whose trained head
    is loaded next (a LoRA checkpoint's base), which the notes then name instead.
    """
    result = LoadResult(source=str(source))
    if _names_a_file(source):
        sd = read_state_dict(source)
    elif str(source).startswith(hub.HF_HUB):
        sd = _from_timm_hub(str(source))
    else:
        import timm

        if not timm.is_model(str(source).split(".")[0]):
            raise UserPathError(
                f"{source!r} is neither a checkpoint file nor a timm pretrained model name"
            )
        sd = _from_timm_hub(str(source))
    warn_quick_gelu(sd, model, str(source))
    sd = _adapt(to_timm_names(sd), model, result)
    _check(sd, model, result)
    with torch.no_grad():
        model.load_state_dict(sd, strict=not (result.head_reset or result.fresh))
    if head_from is not None:
        result.notes = [note.replace(FRESH_HEAD, f"the trained head comes from {head_from}")
                        for note in result.notes]
    for note in result.notes:
        log.warning("%s: %s", result.source, note)
    return result


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # 0.1's hub_cache, hub_folder, HF_HUB, ... (vit/_graveyard.py)
