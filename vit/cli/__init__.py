"""What `vit fit` adds to LightningCLI: the CLI (`main`), its parser, console, pre-flight checks and trainer
callbacks, and the data a config builds.

    main.py       `cli`, `VitCLI`: LightningCLI for `vit fit | validate | test | predict`
    parser.py     the argument parser, whose errors name the key, the file and the fix
    console.py    what `vit fit` prints: the model in two lines, the progress bar, the quiet dependencies
    preflight.py  fail in seconds when a config's pretrained weights cannot be had
    after_fit.py  what fit does once trained: calibrate the checkpoints on val, test the best one
    ckpt_path.py  what --ckpt_path names: best and last found, a damaged, missing or other task's file named
    training.py   the trainer's callbacks: atomic, best and last checkpoints, the random state, the report, curves
    data.py       images from the DataModule a config builds (int8 calibration)

Light on purpose: `vit.cli.preflight` runs before Lightning is imported, so this package imports nothing until a
name is asked for (``from vit.cli import cli`` imports `vit.cli.main`, and Lightning with it).
"""

from __future__ import annotations

import importlib
from typing import Any

from vit._graveyard import moved_name

_MAIN = ("cli", "VitCLI", "ConfigOnlyCLI", "build_model_and_data", "DESCRIPTION", "follow_the_weights",
         "data_class")
_CKPT_PATH = ("check_checkpoint_exists", "check_checkpoint_task")


def __getattr__(name: str) -> Any:
    if name in _MAIN or name in _CKPT_PATH:
        return getattr(importlib.import_module("vit.cli.main" if name in _MAIN else "vit.cli.ckpt_path"), name)
    return moved_name(__name__, name)  # names `vit.cli` (then a module) had in 0.1 (vit/_graveyard.py)
