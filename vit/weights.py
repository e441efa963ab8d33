"""Load real pretrained checkpoints (timm, torchvision, big_vision .npz) into a `VisionTransformer`.

Every format is converted to timm's state-dict names, the names our model uses, then
adapted to the model: a different head is left freshly initialised, a different patch grid
resamples ``pos_embed``, a different input channel count is folded. Anything else that does
not match is an error that lists the missing and unexpected keys, and the model is untouched.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from vit.errors import UserPathError, UserValueError, WeightsUnavailableError
from vit.nn.vision import VisionTransformer, resample_pos_embed

log = logging.getLogger(__name__)

PICKLE_SUFFIXES = {".pth", ".pt", ".bin", ".ckpt"}
SUFFIXES = PICKLE_SUFFIXES | {".safetensors", ".npz"}
HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # in a Hugging Face hub folder (`vit export`, timm)


@dataclass
class LoadResult:
    """What `load_pretrained` did beyond copying tensors."""

    source: str
    head_reset: bool = False
    pos_embed_resampled: bool = False
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- reading


def read_state_dict(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read a checkpoint file (or a hub folder's weights) into a flat {name: tensor} dict, in the file's naming."""
    path = Path(path)
    if path.is_dir():
        found = [path / name for name in HUB_WEIGHTS if (path / name).is_file()]
        if not found:
            raise UserPathError(f"{path}: a folder without {' or '.join(HUB_WEIGHTS)}")
        path = found[0]
    if not path.is_file():
        raise UserPathError(f"checkpoint file not found: {path}")
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
    except Exception as e:  # a corrupt file fails in each library's own way; name the file
        raise UserValueError(f"{path}: not a readable {suffix} checkpoint ({type(e).__name__}: {e})") from e
    raise UserValueError(
        f"{path}: unknown checkpoint suffix {suffix!r}; expected one of {', '.join(sorted(SUFFIXES))}"
    )


def _unwrap(obj: object, path: Path) -> dict[str, Tensor]:
    """Find the state dict inside the containers that training scripts save."""
    for key in ("state_dict", "model", "module", "model_state"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise UserValueError(f"{path}: expected a state dict of tensors, found {type(obj).__name__}")
    # Lightning prefixes the model's keys with its attribute name, DDP with 'module.'. A `vit fit`
    # checkpoint with EMA holds both copies; the EMA weights are the ones it validated and tested.
    for prefix in ("model_ema.module.", "model.", "module."):
        inner = {k[len(prefix):]: v for k, v in obj.items() if k.startswith(prefix)}
        if inner and any(k.startswith("blocks.") or k.startswith("encoder.") for k in inner):
            return inner
    return obj


# ---------------------------------------------------------------------------- converting


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

    mha, mlp, ln2 = (0, 0, 1) if big_vision else (1, 3, 2)
    if stacked:
        depth = w[f"{prefix}Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
    else:
        pattern = re.compile(re.escape(prefix) + r"Transformer/encoderblock_(\d+)/")
        depth = 1 + max((int(m.group(1)) for k in w if (m := pattern.match(k))), default=-1)
    for i in range(depth):
        b, idx = ("Transformer/encoderblock/", i) if stacked else (f"Transformer/encoderblock_{i}/", None)
        a = f"{b}MultiHeadDotProductAttention_{mha}/"
        qkv = [get(f"{a}{n}/kernel", idx) for n in ("query", "key", "value")]
        out |= {
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


def to_timm_names(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Detect the checkpoint's naming and convert it to timm's."""
    if any(k.endswith("embedding/kernel") for k in sd):
        return convert_npz(sd)
    if "class_token" in sd or "conv_proj.weight" in sd:
        return convert_torchvision(sd)
    return dict(sd)


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
    own_pos = own["pos_embed"]
    if pos is not None and pos.shape != own_pos.shape and pos.shape[-1] == own_pos.shape[-1]:
        n_old = pos.shape[1] - model.num_prefix_tokens
        side = math.isqrt(n_old)
        if side * side == n_old:
            sd["pos_embed"] = resample_pos_embed(pos, model.patch_embed.grid_size, (side, side))
            result.pos_embed_resampled = True
            result.notes.append(
                f"resampled pos_embed from a {side}x{side} to a "
                f"{model.patch_embed.grid_size[0]}x{model.patch_embed.grid_size[1]} patch grid"
            )

    head_keys = [k for k in sd if k.startswith("head.")]
    if not head_keys and any(k.startswith("head.") for k in own):  # an encoder alone (MAE's, timm's num_classes=0)
        result.head_reset = True
        result.notes.append("the checkpoint has no classifier head (a pre-trained encoder): the head stays freshly "
                            "initialised")
    elif head_keys and any(k not in own or own[k].shape != sd[k].shape for k in head_keys):
        n_ckpt = sd["head.weight"].shape[0] if "head.weight" in sd else "?"
        for k in head_keys:
            del sd[k]
        result.head_reset = True
        result.notes.append(
            f"checkpoint head has {n_ckpt} classes, model has {model.num_classes}: "
            "the head stays freshly initialised"
        )
    return sd


def _check(sd: dict[str, Tensor], model: VisionTransformer, result: LoadResult) -> None:
    own = model.state_dict()
    missing = [k for k in own if k not in sd and not (result.head_reset and k.startswith("head."))]
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


HUB_FILES = ("model.safetensors", "pytorch_model.bin")  # what timm publishes in a `timm/<name>` repository
HUB_PROBE_SECONDS = 5.0


def _from_timm_hub(name: str) -> dict[str, Tensor]:
    """The weights of a timm pretrained name, in timm's names, from the Hugging Face cache or hub.

    timm publishes its ViT weights as ``timm/<name>`` repositories holding a timm-format
    ``model.safetensors`` (or ``pytorch_model.bin``): read straight from the cache when it holds one,
    else downloaded, without building timm's model. Weights published elsewhere or in another layout go
    through ``timm.create_model``. Offline, this fails within seconds: huggingface_hub itself retries an
    unreachable hub for about 25 s per file.
    """
    import timm
    from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    if cfg is None or not cfg.hf_hub_id or cfg.hf_hub_filename or cfg.source:
        return _from_timm_create_model(name)
    repo_id, _, revision = cfg.hf_hub_id.partition("@")
    for filename in HUB_FILES:
        cached = try_to_load_from_cache(repo_id, filename, revision=revision or None)
        if isinstance(cached, str):
            return read_state_dict(cached)
    if constants.HF_HUB_OFFLINE:
        raise WeightsUnavailableError(_hub_advice(name, repo_id, "not in the cache, and HF_HUB_OFFLINE is set"))
    unreachable = _unreachable(constants.ENDPOINT)
    if unreachable:
        raise WeightsUnavailableError(_hub_advice(name, repo_id, f"not in the cache, and {unreachable}"))
    missing = []
    for filename in HUB_FILES:
        try:
            path = hf_hub_download(repo_id, filename, revision=revision or None, library_name="timm",
                                   library_version=timm.__version__)
        except EntryNotFoundError as e:  # not in the repository: try the next
            missing.append(f"{filename}: {type(e).__name__}")
            continue
        except Exception as e:  # network, authentication, a broken cache: the same advice
            raise WeightsUnavailableError(_hub_advice(name, repo_id, f"{type(e).__name__}: {e}")) from e
        return read_state_dict(path)
    raise WeightsUnavailableError(_hub_advice(name, repo_id, "; ".join(missing)))


def _unreachable(endpoint: str, timeout: float = HUB_PROBE_SECONDS) -> str | None:
    """Why the hub at ``endpoint`` cannot be reached (name lookup or TCP connect), or None; at most ``timeout``
    seconds, name lookup included (run in a thread, since getaddrinfo has no timeout of its own)."""
    import socket
    import threading
    from urllib.parse import urlparse

    url = urlparse(endpoint)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(f"the hub at {endpoint} is unreachable ({type(e).__name__}: {e})")

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"the hub at {endpoint} did not answer within {timeout:g} s"


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


def _hub_advice(name: str, repo_id: str, reason: str) -> str:
    """Where the weights of a timm name were looked for, and the three ways on without network."""
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    return (
        f"cannot load pretrained weights {name!r}: {reason}.\n"
        f"Looked in the Hugging Face cache: {folder} ($HF_HUB_CACHE, else $HF_HOME/hub).\n"
        "Three ways on:\n"
        f"  1. fill the cache on a connected machine (`hf download {repo_id} model.safetensors`), copy "
        f"{folder.name} here and set HF_HUB_OFFLINE=1;\n"
        f"  2. pass a local file: --model.init_args.pretrained path/to/model.safetensors (or .pth, .npz; "
        f"from https://huggingface.co/{repo_id});\n"
        "  3. train from scratch: vit fit --config configs/scratch_small.yaml --data.init_args.root YOUR_FOLDER\n"
        "     (not --model.init_args.pretrained null here: random weights at a fine-tuning lr learn little)."
    )


def load_pretrained(model: VisionTransformer, source: str | os.PathLike) -> LoadResult:
    """Load a checkpoint file (.safetensors, .pth, .bin, .npz), a hub folder or a timm pretrained name.

    timm, torchvision and big_vision/original-ViT layouts are recognised. A head of another
    size stays freshly initialised, another patch grid resamples ``pos_embed``; any other
    mismatch raises ``ValueError`` before a single weight is changed.
    """
    result = LoadResult(source=str(source))
    path = Path(source)
    if path.suffix.lower() in SUFFIXES or path.exists() or os.sep in str(source):
        sd = read_state_dict(path)
    else:
        import timm

        if not timm.is_model(str(source).split(".")[0]):
            raise UserPathError(
                f"{source!r} is neither a checkpoint file nor a timm pretrained model name"
            )
        sd = _from_timm_hub(str(source))
    sd = _adapt(to_timm_names(sd), model, result)
    _check(sd, model, result)
    with torch.no_grad():
        model.load_state_dict(sd, strict=not result.head_reset)
    for note in result.notes:
        log.warning("%s: %s", result.source, note)
    return result
