"""A dataset's fingerprint: a hash of what its items depend on, so cached results can be keyed by it.

Every dataset class in `vit.data` has a ``fingerprint()`` built from these helpers: file datasets hash
their paths, sizes and modification times (not the contents: a folder of a million files is keyed in a
second); in-memory datasets hash their arrays. The transform is part of it, through its ``repr``.
Values are fed to the hash by `vit.hashing.digest`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vit.hashing import digest


def fingerprint(*values: Any) -> str:
    """The sha256 hex digest of ``values``, in order."""
    h = hashlib.sha256()
    for value in values:
        digest(h, value)
    return h.hexdigest()


def files_fingerprint(kind: str, transform: Any, samples: Iterable[tuple[str, int]]) -> str:
    """The fingerprint of a file dataset: its kind, transform, and every (resolved path, label, size, mtime)."""
    h = hashlib.sha256()
    digest(h, [kind, repr(transform)])
    for path, label in samples:
        stat = os.stat(path)
        digest(h, [str(Path(path).resolve()), int(label), stat.st_size, stat.st_mtime_ns])
    return h.hexdigest()
