"""Data: image and text DataModules, and the Lightning-free reading and transforms beneath them.

``vit.data.io`` (reading, scanning, splits), ``vit.data.transforms`` and ``vit.data.tokenizers``
import no Lightning; the DataModules below are imported on first use, so reading an image for
prediction never loads Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

# DataModule -> the module that defines it (each family in its own file).
_DATAMODULES = {
    "ImageDataModule": "vit.data.base",
    "Digits": "vit.data.digits",
    "CIFAR": "vit.data.cifar",
    "ImageFolder": "vit.data.folder",
    "ImageNet": "vit.data.folder",
    "LabelsFile": "vit.data.table",
    "ImageShards": "vit.data.stream",
    "UnlabelledFolder": "vit.data.unlabelled",
    "TranslationDataModule": "vit.data.translation",
    "SyntheticTranslationDataModule": "vit.data.translation",
}

__all__ = sorted(_DATAMODULES)


def __getattr__(name: str) -> Any:
    if name in _DATAMODULES:
        return getattr(importlib.import_module(_DATAMODULES[name]), name)
    raise AttributeError(f"module 'vit.data' has no attribute {name!r}")
