"""Writing files so that a kill at any moment leaves the old file or the new one, and where `vit` caches things.

Checkpoints, exports, reports and the feature cache are all written through `save_atomic`. Imports no torch.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any


def out_problem(path: str | os.PathLike, kind: str) -> str | None:
    """Why ``path`` cannot be the output ``kind`` ("file" or "folder") a command will write, or None: checked
    before any work, so a mistake costs a line, not the export or the predictions already computed."""
    path = Path(path)
    blocking = next((p for p in (path, *path.parents) if p.exists()), None)  # the nearest part that exists
    if blocking is not None and blocking != path and not blocking.is_dir():
        return f"{blocking} is a file, so {path} cannot be created under it"
    if kind == "file" and path.is_dir():
        return f"{path} is a folder; name a file in it, e.g. {path / 'predictions.csv'}"
    if kind == "folder" and path.exists() and not path.is_dir():
        return f"{path} is a file; name a folder to write into"
    if kind == "folder" and path.suffix.lower() in (".onnx", ".safetensors", ".ckpt", ".json", ".csv"):
        return f"{path} looks like a file name, but this is the folder the files go into; e.g. --out {path.parent}"
    return None


def save_atomic(write: Callable[[Any], None], path: str | os.PathLike) -> Path:
    """Write a file through ``write(file_object)`` so that a kill at any moment leaves the old file or
    the new one, never a torn one: a temporary file in the same folder (same filesystem), flushed
    and fsynced, then renamed over ``path`` with ``os.replace``.

    The file gets the mode a plain ``open(path, "wb")`` would give it: the umask's (0644 under umask
    022) for a new file, the old file's mode when one is replaced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            if path.exists():  # as an overwrite in place would, keep a mode the user chose
                os.fchmod(f.fileno(), stat.S_IMODE(path.stat().st_mode))
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
    return path


def _create_temp(path: Path) -> tuple[int, str]:
    """A new, empty ``.NAME.XXXX.tmp`` beside ``path``, opened for writing: (fd, its path).

    Not `tempfile.mkstemp`: it creates files 0600, and the rename would keep that. Opening with 0666
    lets the kernel apply the umask (or the folder's default ACL) itself, so no umask is read or set
    (``os.umask`` can only be read by setting it, a race with other threads creating files).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:  # another writer drew the same name: draw again
            continue


def cache_dir(*parts: str) -> Path:
    """A folder under `vit`'s cache: $XDG_CACHE_HOME/vit/PARTS, else ~/.cache/vit/PARTS."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "vit", *parts)
