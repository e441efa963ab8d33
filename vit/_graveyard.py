"""The old import paths, in one table: each still works until 0.3.0, with a DeprecationWarning naming the new path.

0.1 had flat modules (`vit.checkpoint`, `vit.inference`, `vit.weights`, ...); 0.2 groups them into packages by
concern (`vit.deploy`, `vit.checkpoints`, `vit.cli`). Users' notebooks import the old paths, so:

- a module that is gone (`MODULES`) is made on import by a finder on ``sys.meta_path`` (`install`, called by
  `vit/__init__.py`): ``import vit.weights`` warns once, and each name asked of it (``vit.weights.load_pretrained``)
  is looked up in the modules listed, warning with the one that defines it;
- a name that left a module that is still there (`NAMES`: ``vit.cli.experiment_folder``; `NEW_NAMES` where it
  was renamed too) is found by that module's ``__getattr__``, which calls `moved_name`; one with no successor
  (`GONE`: ``vit.tasks.finetune.check_strategy``) is an ImportError that says what to do instead;
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
    "vit.tasks.adapters": ("vit.tasks.ema",),  # 0.2's task layer: adapters are a strategy (`GONE`), the EMA stays
}

# names that left a module that is still there -> (module, name): the module the name lives in now
NAMES: dict[tuple[str, str], str] = {
    ("vit.cli", "experiment_folder"): "vit.checkpoints.runs",  # vit.cli was 0.1's module of `vit fit`
    ("vit.cli", "checkpoint_folders"): "vit.checkpoints.runs",
    ("vit.cli", "checkpoint_by_name"): "vit.checkpoints.runs",
    ("vit.cli", "TrainingCurves"): "vit.cli.training",
    ("vit.features", "new_run_folder"): "vit.checkpoints.runs",
    # 0.2's task layer (issue 62): the classifier's parts, the old spellings in compat, the hub in its own module
    ("vit.tasks.classify", "MOVED"): "vit.tasks.compat",
    ("vit.tasks.classify", "old_arguments"): "vit.tasks.compat",
    ("vit.tasks.classify", "upgraded_hparams"): "vit.tasks.compat",
    ("vit.tasks.contrastive", "check_head_init"): "vit.tasks.classify",
    ("vit.tasks.finetune", "STRATEGIES"): "vit.tasks.compat",  # the old strings, as the keys of a dict now
    ("vit.preprocessing", "pretrained_preprocessing"): "vit.checkpoints.pretrained_cfg",
    ("vit.checkpoints.lora", "load_base"): "vit.checkpoints.weights",
    ("vit.checkpoints.lora", "load_merged"): "vit.checkpoints.weights",
    ("vit.checkpoints.lora", "Loader"): "vit.checkpoints.weights",
    ("vit.checkpoints.weights", "hub_cache"): "vit.checkpoints.hub",
    ("vit.checkpoints.weights", "hub_folder"): "vit.checkpoints.hub",
    ("vit.checkpoints.weights", "HF_HUB"): "vit.checkpoints.hub",
    ("vit.checkpoints.weights", "HUB_WEIGHTS"): "vit.checkpoints.hub",
    ("vit.checkpoints.weights", "HUB_PROBE_SECONDS"): "vit.checkpoints.hub",
}

# names that live on under another name -> (module, name) of the new one
NEW_NAMES: dict[tuple[str, str], tuple[str, str]] = {
    ("vit.tasks.finetune", "LoraOptions"): ("vit.tasks.finetune", "Adapters"),  # options and strategy in one
    ("vit.tasks.multilabel", "LabelEvaluation"): ("vit.tasks.multilabel", "MultiLabelEvaluation"),
}

# names with no successor -> what to do instead: asking for one is an ImportError saying so (an ImportError, not
# an AttributeError: ``from m import name`` keeps its message)
_PARTS = "a fine-tuning strategy (vit.tasks.finetune: Full, LinearProbe, Partial, Staged, Adapters)"
GONE: dict[tuple[str, str], str] = {
    ("vit.tasks.adapters", "AdapterTraining"): "adapters are the strategy vit.tasks.finetune.Adapters (finetune: "
                                               "{class_path: vit.tasks.finetune.Adapters})",
    ("vit.tasks.finetune", "ADAPTERS"): "adapters are one class: isinstance(finetune, vit.tasks.finetune.Adapters)",
    ("vit.tasks.finetune", "check_strategy"): f"{_PARTS} checks itself: strategy.check(depth); an old string "
                                              "becomes one with vit.tasks.compat.strategy_named",
    ("vit.tasks.finetune", "frozen_parts"): f"{_PARTS} answers it: strategy.frozen(network, roles, epoch)",
    ("vit.tasks.finetune", "unfreeze_epoch"): f"{_PARTS} answers it: strategy.unfreeze_epoch()",
    ("vit.tasks.multilabel", "label_test_report"): "the test report is vit.tasks.multilabel.label_report, which "
                                                   "MultiLabelEvaluation.end('test', run) calls",
    ("vit.tasks.contrastive", "HEAD_INITS"): "head_init is random, zeroshot or zeroshot:TEMPLATES, checked by "
                                             "vit.tasks.classify.check_head_init",
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
    """``module.name`` for a name that moved (`NAMES`, `NEW_NAMES`, `RENAMED`, or any name of a gone module), with a
    DeprecationWarning naming where to import it from now; ImportError saying what to do instead for a name that
    is gone (`GONE`); AttributeError for a name the module never had."""
    if (module, name) in GONE:
        raise ImportError(f"{module}.{name} is gone (since 0.2): {GONE[module, name]}", name=module)
    if name in RENAMED and module in _RENAMED_IN:
        _warn(f"{module}.{name} is now {RENAMED[name]}")
        return globals()[name]
    if (module, name) in NEW_NAMES:
        new, new_name = NEW_NAMES[module, name]
        _warn(f"{module}.{name} is now {new}.{new_name}: import that from {new}")
        return getattr(importlib.import_module(new), new_name)
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
        gone = "".join(f"; {name} is gone: {advice}" for (m, name), advice in GONE.items() if m == old)
        # stacklevel 2 is the importing line: warnings skips importlib's own frames
        warnings.warn(f"{old} moved: import from {', '.join(new)}{gone} (the old path goes in {REMOVED_IN})",
                      DeprecationWarning, stacklevel=2)


def install() -> None:
    """Put the finder of the gone modules first on ``sys.meta_path``, once: first, so that a stale file of an old
    path (a checkout or an editable install of 0.1) cannot answer for it."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths())
