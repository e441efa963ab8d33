"""The old import paths, in one table: each still works until 0.3.0, with a DeprecationWarning naming the new path.

0.1 had flat modules (`vit.checkpoint`, `vit.inference`, `vit.weights`, ...); 0.2 groups them into packages by
concern (`vit.deploy`, `vit.checkpoints`, `vit.cli`). Users' notebooks import the old paths, so:

- a module that is gone (`MODULES`) is made on import by a finder on ``sys.meta_path`` (`install`, called by
  `vit/__init__.py`): ``import vit.weights`` warns once, and each name asked of it (``vit.weights.load_pretrained``)
  is looked up in the modules listed, warning with the one that defines it;
- a name that left a module that is still there (`NAMES`: ``vit.cli.experiment_folder``) is found by that
  module's ``__getattr__``, which calls `moved_name`;
- a function that became another with other arguments (`RENAMED`: ``load_backend``) is kept below, as a wrapper.

Lightning's ``_graveyard`` and timm's table of deprecated names work this way. This module imports nothing of
`vit` at import time (the new modules are imported by name when a name is asked for), so it adds no arrow to
the import graph; each entry has a test (tests/test_layout.py). Removing an old path is deleting its line.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

REMOVED_IN = "0.3.0"

# 0.1's modules that are gone -> the modules their names live in now, searched in this order
MODULES: dict[str, tuple[str, ...]] = {
    "vit.checkpoint": ("vit.checkpoints.io", "vit.checkpoints.meta", "vit.checkpoints.runs", "vit.deploy.classifier",
                       "vit.deploy.backends"),
    "vit.backends": ("vit.deploy.backends",),
    "vit.cli_parser": ("vit.cli.parser",),
    "vit.console": ("vit.cli.console",),
    "vit.convert": ("vit.checkpoints.convert",),
    "vit.cpu": ("vit.deploy.cpu",),
    "vit.export": ("vit.deploy.export", "vit.deploy.metadata"),
    "vit.fusion": ("vit.deploy.fusion",),
    "vit.image_files": ("vit.deploy.image_files",),
    "vit.inference": ("vit.deploy.inference", "vit.deploy.metadata", "vit.deploy.backends"),
    "vit.preflight": ("vit.cli.preflight",),
    # cli.data first: its calibration_images takes a `vit fit` config, as 0.1's did (deploy.quantize's a folder)
    "vit.quantize": ("vit.cli.data", "vit.deploy.quantize"),
    "vit.training": ("vit.cli.training",),
    "vit.weights": ("vit.checkpoints.weights", "vit.checkpoints.convert"),
}

# names that left a module that is still there -> (module, name): the module the name lives in now
NAMES: dict[tuple[str, str], str] = {
    ("vit.cli", "experiment_folder"): "vit.checkpoints.runs",  # vit.cli was 0.1's module of `vit fit`
    ("vit.cli", "checkpoint_folders"): "vit.checkpoints.runs",
    ("vit.cli", "checkpoint_by_name"): "vit.checkpoints.runs",
    ("vit.cli", "TrainingCurves"): "vit.cli.training",
    ("vit.features", "new_run_folder"): "vit.checkpoints.runs",
}

# functions that became another with other arguments -> how to call the new one; the wrappers are below. They
# answer in `vit.deploy` and in the gone modules that searched `vit.deploy.backends`.
RENAMED: dict[str, str] = {
    "load_backend": "vit.deploy.load_classifier(path, device, backend=...)",
    "load_model": "vit.deploy.load_classifier(path, device)",
}
_RENAMED_IN = ("vit.deploy", *(old for old, new in MODULES.items() if "vit.deploy.backends" in new))


def load_backend(path: str | os.PathLike, backend: str | None = None, device: Any = "cpu", **kwargs: Any) -> Any:
    """0.1's loader of a checkpoint or an export on an engine: `vit.deploy.load_classifier`."""
    load_classifier = importlib.import_module("vit.deploy.backends").load_classifier
    return load_classifier(path, device, backend=backend, **kwargs)


def load_model(path: str | os.PathLike, device: Any = "cpu", **kwargs: Any) -> Any:
    """0.1's loader of a checkpoint or an .onnx file: `vit.deploy.load_classifier`."""
    return importlib.import_module("vit.deploy.backends").load_classifier(path, device, **kwargs)


def _warn(message: str) -> None:
    # stacklevel 4: past this function, moved_name and the module's __getattr__, to the line that named the path
    warnings.warn(f"{message} (the old path goes in {REMOVED_IN})", DeprecationWarning, stacklevel=4)


def _home(modules: Sequence[str], name: str) -> str | None:
    """The first of ``modules`` that defines ``name``, else the first that has it (imported from elsewhere)."""
    having = [m for m in modules if hasattr(importlib.import_module(m), name)]
    defining = [m for m in having
                if getattr(getattr(importlib.import_module(m), name), "__module__", m) == m]
    return (defining or having or [None])[0]


def moved_name(module: str, name: str) -> Any:
    """``module.name`` for a name that moved (`NAMES`, `RENAMED`, or any name of a gone module), with a
    DeprecationWarning naming where to import it from now; AttributeError for a name the module never had."""
    if name in RENAMED and module in _RENAMED_IN:
        _warn(f"{module}.{name} is now {RENAMED[name]}")
        return globals()[name]
    new = NAMES.get((module, name))
    if new is None and module in MODULES and not name.startswith("__"):
        new = _home(MODULES[module], name)
    if new is None:
        where = f" (its names moved to {', '.join(MODULES[module])})" if module in MODULES else ""
        raise AttributeError(f"module {module!r} has no attribute {name!r}{where}")
    _warn(f"{module}.{name} moved to {new}.{name}: import it from {new}")
    return getattr(importlib.import_module(new), name)


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes each gone module of `MODULES` on import: an empty module whose names `moved_name` finds."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MODULES else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        old, new = module.__name__, MODULES[module.__name__]
        module.__doc__ = f"The old path of {', '.join(new)}, until {REMOVED_IN} (vit/_graveyard.py)."
        module.__getattr__ = lambda name: moved_name(old, name)
        module.__dir__ = lambda: sorted({n for m in new for n in dir(importlib.import_module(m))
                                         if not n.startswith("_")})
        # stacklevel 2 is the importing line: warnings skips importlib's own frames
        warnings.warn(f"{old} moved: import from {', '.join(new)} (the old path goes in {REMOVED_IN})",
                      DeprecationWarning, stacklevel=2)


def install() -> None:
    """Put the finder of the gone modules first on ``sys.meta_path``, once: first, so that a stale file of an old
    path (a checkout or an editable install of 0.1) cannot answer for it."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths())
