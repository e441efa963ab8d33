"""Mistakes a user can fix, and how `vit` shows them: one short message, no traceback.

Code raises a `UserError` where a bad path, key, value or file enters (a config, a flag, a checkpoint);
`vit` prints ``vit <command>: error: <message>`` and exits 1. Every other exception is a bug and keeps its
traceback. ``--traceback`` (or ``VIT_TRACEBACK=1``) shows the traceback of a user error too, for bug reports.

The subclasses also derive from the built-in type a Python caller would catch (``FileNotFoundError``,
``ValueError``, ``RuntimeError``), so ``except FileNotFoundError`` keeps working.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable


class UserError(Exception):
    """A mistake the user can fix; its message names the path, key or value and says what to do."""


class UserPathError(UserError, FileNotFoundError):
    """A file or folder that is missing, or not laid out as expected."""


class UserValueError(UserError, ValueError):
    """A value (in a config, a flag or a file) that cannot be used."""


class MissingPackageError(UserError, ImportError):
    """An optional package the command needs is not installed; the message says which extra brings it."""


class WeightsUnavailableError(UserError, RuntimeError):
    """Pretrained weights that cannot be had: not in the local cache, and the hub unreachable."""


TRACEBACK_ENV = "VIT_TRACEBACK"


def want_traceback() -> bool:
    """Whether user errors should show their traceback (``VIT_TRACEBACK=1``, set by ``--traceback``)."""
    return os.environ.get(TRACEBACK_ENV, "").lower() not in ("", "0", "false", "no")


# Optional packages -> the extra of pyproject.toml that brings each (one feature each).
EXTRAS = {"litdata": "shards", "webdataset": "shards", "wandb": "wandb", "onnx": "export", "onnxruntime": "export",
          "onnxscript": "export", "fastapi": "serve", "uvicorn": "serve", "ipywidgets": "notebook",
          "pyarrow": "hf", "datasets": "hf"}


def missing_extra(error: BaseException) -> MissingPackageError | None:
    """A `MissingPackageError` naming the extra to install, when ``error`` is the import of an optional package
    failing (ours, or Lightning's loggers, which say it in words: "Requirement 'wandb>=…' not met")."""
    if not isinstance(error, ImportError):
        return None
    words = str(error)
    for package, extra in EXTRAS.items():
        if getattr(error, "name", None) == package or f"'{package}" in words or f"`{package}" in words:
            return MissingPackageError(f"{package} is not installed; this feature needs it: pip install 'vit[{extra}]'")
    return None


def find_user_error(error: BaseException) -> UserError | None:
    """``error`` or the first `UserError` it was raised from (jsonargparse wraps constructor errors); an optional
    package that is not installed counts as one (`missing_extra`)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, UserError):
            return current
        missing = missing_extra(current)
        if missing is not None:
            return missing
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the nearest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
