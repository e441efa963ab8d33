"""What `vit fit` adds to LightningCLI: the CLI (`main`), its parser, console, pre-flight checks and trainer
callbacks, and the data a config builds.

Light on purpose: `vit.cli.preflight` runs before Lightning is imported, so this package imports nothing until a
name is asked for (``from vit.cli import cli`` imports `vit.cli.main`, and Lightning with it).
"""

from __future__ import annotations

import importlib
from typing import Any

from vit._moved import forward

_MAIN = ("cli", "VitCLI", "ConfigOnlyCLI", "build_model_and_data", "DESCRIPTION", "follow_the_weights",
         "data_class", "check_checkpoint_exists", "check_checkpoint_task")
# names `vit.cli` (then a module) had in 0.1 that now live elsewhere
_moved = forward(__name__, ["vit.checkpoints.runs", "vit.cli.training"], stacklevel=3)


def __getattr__(name: str) -> Any:
    if name in _MAIN:
        return getattr(importlib.import_module("vit.cli.main"), name)
    return _moved(name)
