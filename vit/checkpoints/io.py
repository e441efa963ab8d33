"""Checkpoint files: written atomically, read as data with clear errors, and found again in their folders.

Nothing here imports Lightning. A damaged file (a save cut short by a kill) or a missing one is an error that
names the checkpoints that do exist; a sharded FSDP folder reads as one checkpoint.
"""

from __future__ import annotations

import os
import re
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vit.errors import UserPathError, UserValueError
from vit.files import save_atomic

# FSDP with state_dict_type "sharded" saves a checkpoint as a folder: torch.distributed.checkpoint files
# (".metadata" and one "*.distcp" per rank) for the weights and optimiser, and Lightning's "meta.pt" for the rest.
SHARDED_META = "meta.pt"


class DamagedCheckpointError(UserValueError):
    """A checkpoint file that cannot be read: truncated by a kill, or not a checkpoint at all."""


# ---- writing ---------------------------------------------------------------------------------
def save_checkpoint(checkpoint: dict[str, Any], path: str | os.PathLike) -> Path:
    """``torch.save`` a checkpoint atomically (see `save_atomic`)."""
    return save_atomic(lambda f: torch.save(checkpoint, f), path)


# ---- reading ---------------------------------------------------------------------------------
def is_sharded(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a sharded checkpoint folder (FSDP's, see `SHARDED_META`)."""
    path = Path(path)
    return (path / SHARDED_META).is_file() and (path / ".metadata").is_file()


def is_intact(path: str | os.PathLike) -> bool:
    """Whether a torch checkpoint file is whole, judged from its zip directory (cheap: no tensor is read).

    A save cut short loses the directory at the end of the file, so a torn file fails here. A sharded
    folder counts as whole when its meta.pt is and its shards' index exists.
    """
    if Path(path).is_dir():
        return is_sharded(path) and is_intact(Path(path) / SHARDED_META)
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("data.pkl") for name in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def checkpoint_progress(path: str | os.PathLike) -> tuple[int | None, int | None]:
    """(epoch, global step) of a checkpoint, from its name (``epoch=3-step=120``) or else its contents."""
    name = Path(path).name
    epoch, step = re.search(r"epoch=(\d+)", name), re.search(r"step=(\d+)", name)
    if epoch and step:
        return int(epoch.group(1)), int(step.group(1))
    try:
        # mmap: only the small entries are read from disk, not the tensors.
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return checkpoint.get("epoch"), checkpoint.get("global_step")
    except Exception:
        return None, None


def describe_checkpoints(folder: str | os.PathLike, exclude: str | os.PathLike | None = None) -> list[str]:
    """One line per other checkpoint in ``folder``, newest first: name, epoch, step, and whether it is intact."""
    lines = []
    paths = [p for p in Path(folder).glob("*.ckpt") if exclude is None or p.resolve() != Path(exclude).resolve()]
    for path in sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True):
        if not is_intact(path):
            state = "damaged"
        else:
            epoch, step = checkpoint_progress(path)
            state = f"epoch {epoch}, step {step}" if epoch is not None else "?"
        lines.append(f"{path} ({state})")
    return lines


def newest_checkpoint(folder: str | os.PathLike, which: str) -> Path | None:
    """The newest last*.ckpt in ``folder`` (``which`` "last"), or the checkpoint the latest run scored best
    ("best"); None when there is none.

    The run's best is the one its newest checkpoint's BestCheckpoint state names: with ``checkpoint.save_top_k``
    above 1 the newest best-*.ckpt is only the latest of the top k, and a ``checkpoint.filename`` of the user's
    need not start with "best-". A checkpoint without that state falls back to the newest best-*.ckpt.
    """
    folder = Path(folder)
    found = [p for p in folder.glob("*.ckpt") if p.is_file()]
    newest = lambda paths: max(paths, key=lambda p: p.stat().st_mtime) if paths else None
    if which == "last":
        return newest([p for p in found if p.name.startswith("last")])
    if found and (named := _named_best(newest(found))) is not None and (folder / named).is_file():
        return folder / named
    return newest([p for p in found if p.name.startswith("best-")])


def _named_best(path: Path) -> str | None:
    """The file name of the run's best checkpoint as ``path``'s BestCheckpoint state recorded it when ``path``
    was saved, or None (no such state, or a damaged file, which whoever loads it will name)."""
    try:
        state = best_checkpoint_state(read_checkpoint(path, mmap=True))
    except (UserValueError, UserPathError):
        return None
    best = (state or {}).get("best_model_path")
    return Path(best).name if best else None


# The class of `vit fit`'s best-checkpoint callback (`vit.cli.training.BestCheckpoint`): Lightning (2.6) keys a
# callback's state in a checkpoint by its class name and settings, "BestCheckpoint{'monitor': ...}".
BEST_CALLBACK = "BestCheckpoint"


def best_checkpoint_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """What `vit fit`'s best-checkpoint callback kept in ``checkpoint`` when it was saved (``best_model_path``,
    ``best_model_score``, ...), or None: no such state, or several to choose from."""
    callbacks = checkpoint.get("callbacks") or {}
    states = [state for key, state in callbacks.items() if str(key).startswith(BEST_CALLBACK)]
    return states[0] if len(states) == 1 and isinstance(states[0], dict) else None


def damaged_message(path: str | os.PathLike, reason: str) -> str:
    """What to say about a damaged checkpoint: the file, why, and the checkpoints beside it."""
    others = describe_checkpoints(Path(path).parent, exclude=path)
    listing = "\n".join(f"  {line}" for line in others) or "  (none)"
    return (
        f"checkpoint {path} is damaged ({reason}); it was probably cut short by a kill during a save.\n"
        f"Other checkpoints in {Path(path).parent}:\n{listing}"
    )


def existing_checkpoints(path: str | os.PathLike, folders: Sequence[str | os.PathLike] = ()) -> list[Path]:
    """The checkpoints a user may have meant instead of ``path``, newest first: those beside it and in
    ``folders``; when there are none, those `vit fit` writes under the working directory."""
    def found(folder_globs: list[tuple[Path, str]]) -> list[Path]:
        paths = {p.resolve(): p for folder, pattern in folder_globs if folder.is_dir()
                 for p in folder.glob(pattern) if p.suffix == ".ckpt"}
        return sorted(paths.values(), key=lambda p: p.stat().st_mtime, reverse=True)

    near = found([(Path(path).parent, "*.ckpt"), *((Path(f), "*.ckpt") for f in folders)])
    # recipes' checkpoint.dirpath (logs/<name>/checkpoints), Lightning's default, and the folder itself
    return near or found([(Path("."), "*.ckpt"), (Path("."), "logs/*/checkpoints/*.ckpt"),
                          (Path("."), "lightning_logs/version_*/checkpoints/*.ckpt")])


def missing_message(path: str | os.PathLike, folders: Sequence[str | os.PathLike] = (), shown: int = 5) -> str:
    """What to say about a checkpoint path that does not exist: the checkpoints that do."""
    others = existing_checkpoints(path, folders)
    lines = [f"checkpoint not found: {path}"]
    if others:
        lines.append("Checkpoints that exist (newest first):")
        lines += [f"  {p}" for p in others[:shown]]
        lines += [f"  ... and {len(others) - shown} more"] if len(others) > shown else []
    else:
        lines.append(f"No *.ckpt beside it, nor under {Path.cwd()}/logs/*/checkpoints.")
    lines.append("`vit fit` writes best-epoch=E-step=S.ckpt and last.ckpt into its checkpoint.dirpath "
                 "(logs/<recipe>/checkpoints for the recipes in configs/).")
    return "\n".join(lines)


def not_a_checkpoint(path: str | os.PathLike) -> str | None:
    """What a file that is no torch zip file is instead, when that is plain: an ONNX export, an image."""
    if Path(path).suffix.lower() == ".onnx":  # a protobuf: no magic bytes to tell it by, but `vit export` names it
        return (f"{path} is an ONNX export, which `vit predict` and `vit serve` run; this command needs the .ckpt "
                "that `vit fit` wrote (the file it was exported from)")
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            kind = f"a {img.format} image ({img.width}x{img.height})"
    except (UnidentifiedImageError, OSError, ValueError):
        return None
    return (f"this is an image, not a checkpoint: {path} is {kind}. Give a .ckpt file that `vit fit` wrote "
            "(`vit predict --ckpt CKPT IMAGES...`: the checkpoint first, then the images)")


def read_checkpoint(
    path: str | os.PathLike, map_location: str | torch.device = "cpu", *, mmap: bool = False
) -> dict[str, Any]:
    """Load a checkpoint as data (``weights_only``: tensors, numbers, strings; never code to run).

    ``mmap`` leaves the tensors on disk until used: cheap when only the metadata is wanted.
    """
    path = Path(path)
    if is_sharded(path):
        return read_sharded(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.ckpt"))
        best = newest_checkpoint(path, "best") if inside else None
        held = (f"; it holds {', '.join(inside[:5])}{' ...' if len(inside) > 5 else ''}: pass one of them"
                + (f", e.g. its run's best, {best}" if best else "")) if inside else ""
        raise UserPathError(f"{path} is a folder, not a checkpoint (a sharded checkpoint folder holds "
                            f"{SHARDED_META} and .metadata){held}")
    if not path.is_file():
        raise UserPathError(missing_message(path))
    if not is_intact(path):
        if (other := not_a_checkpoint(path)) is not None:
            raise UserValueError(other)
        raise DamagedCheckpointError(damaged_message(path, "not a complete torch zip file"))
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # a torn file fails in the zip reader or the unpickler
        raise DamagedCheckpointError(damaged_message(path, f"{type(e).__name__}: {e}")) from e
    if not isinstance(checkpoint, dict):
        raise UserValueError(f"{path}: expected a checkpoint dict, found {type(checkpoint).__name__}")
    return checkpoint


def read_sharded(path: str | os.PathLike) -> dict[str, Any]:
    """A sharded checkpoint folder as one checkpoint, in this process, without GPUs or a process group:
    meta.pt's entries and the whole ``state_dict``. The optimiser's shards stay on disk (export, predict
    and fine-tune need none of them; to resume, pass the folder itself to ``--ckpt_path``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = Path(path)
    checkpoint = read_checkpoint(path / SHARDED_META)
    try:
        reader = dcp.FileSystemReader(path)
        # Lightning saves {"model": state_dict, "optimizer_0": ...}; the files key each tensor "model.<name>".
        weights = {
            key: torch.empty(meta.size, dtype=meta.properties.dtype)
            for key, meta in reader.read_metadata().state_dict_metadata.items()
            if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
        }
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(weights, storage_reader=reader)
    except (Exception, CheckpointException) as e:  # a missing or torn shard
        raise DamagedCheckpointError(f"sharded checkpoint {path} cannot be read ({type(e).__name__}: "
                                     f"{str(e).strip().splitlines()[-1][:200]})") from e
    checkpoint["state_dict"] = {key.removeprefix("model."): value for key, value in weights.items()}
    return checkpoint
