"""How images are prepared for a model: one record, written once and carried by the checkpoint.

``Preprocessing`` is the normalisation mean/std, the evaluation centre crop and the resize interpolation
(the input size and channels are the model config's). `vit fit` writes it from the data into the checkpoint
(``ImageClassifier.checkpoint_meta``), and everything that prepares an image afterwards reads it from there:
`vit predict`, `vit attention`, `vit serve` (`vit.deploy.Classifier`), `vit export` (the ONNX metadata and
timm's ``pretrained_cfg``) and the ONNX model's runner (`vit.deploy.OnnxClassifier`).

The data follows the weights: what a pretrained source says its images went through is
`vit.checkpoints.pretrained_cfg.pretrained_preprocessing`'s, which `vit fit` uses for every DataModule option the
config leaves unset (`vit.cli`). This module imports nothing of `vit`: everything that prepares images reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vit._graveyard import moved_name
from vit.errors import UserValueError

# The checkpoint's (and the ONNX metadata's) names for the record's fields.
PREPROCESSING_KEYS = ("mean", "std", "crop_pct", "interpolation")
# The DataModule options a pretrained source can fill: the record and the input side.
DATA_KEYS = ("img_size", *PREPROCESSING_KEYS)


# ImageNet's normalisation (timm's IMAGENET_DEFAULT_MEAN/STD): the default for 3 channels, 0.5 for any other count.
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


# The most pixels an image may have once the evaluation resize has scaled it (~120 MB as RGB bytes): a 4-kB PNG of
# 1,000,000 x 1 pixels would otherwise become 248,000,000 x 248 for a 224 model, and its MemoryError end the run.
MAX_RESIZED_PIXELS = 40_000_000


def eval_short_side(img_size: Sequence[int], crop_pct: float) -> int:
    """The short side the evaluation transform scales an image to before its centre crop (timm: the crop over
    crop_pct; rounded up, so a bound)."""
    return math.ceil(max(img_size) / crop_pct)


def resized_pixels(width: int, height: int, short_side: int) -> float:
    """The pixels of a ``width`` x ``height`` image once its short side is scaled to ``short_side``, aspect kept."""
    return max(width, height) * short_side / max(1, min(width, height)) * short_side


def too_elongated(width: int, height: int, short_side: int) -> str | None:
    """Why a ``width`` x ``height`` image cannot be resized to ``short_side`` on its short side (it would pass
    `MAX_RESIZED_PIXELS`), or None."""
    resized = resized_pixels(width, height, short_side)
    if resized <= MAX_RESIZED_PIXELS:
        return None
    return (f"{width}x{height}: scaling its short side to the model's {short_side} pixels would make it "
            f"{resized:,.0f} pixels, over the limit of {MAX_RESIZED_PIXELS:,}; crop it to a less elongated shape")


@dataclass(frozen=True)
class Preprocessing:
    """Normalisation (one mean and std per channel), evaluation centre-crop fraction and resize interpolation."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float = 1.0
    interpolation: str = "bicubic"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))
        object.__setattr__(self, "crop_pct", float(self.crop_pct))

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data (lists, numbers, a string): what a checkpoint and the ONNX metadata hold."""
        return {"mean": list(self.mean), "std": list(self.std), "crop_pct": self.crop_pct,
                "interpolation": self.interpolation}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Preprocessing:
        """The record from ``to_dict``'s keys (other keys, such as a checkpoint's model config, are ignored)."""
        return cls(**{k: values[k] for k in PREPROCESSING_KEYS})

    @classmethod
    def for_channels(cls, chans: int, mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                     crop_pct: float = 1.0, interpolation: str = "bicubic") -> Preprocessing:
        """The record of ``chans``-channel images, with the one default of mean and std (None): ImageNet's for 3
        channels, 0.5 for any other count; a clear error where they do not have one value per channel."""
        mean, std = default_normalisation(chans, mean, std)
        return cls(mean, std, crop_pct, interpolation)


def default_normalisation(chans: int, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
                          ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) of ``chans``-channel images: those given, and for None ImageNet's (3 channels) or 0.5 (any other
    count); a clear error where they do not have one value per channel."""
    if mean is None:
        mean = IMAGENET_MEAN if chans == 3 else (0.5,) * chans
    if std is None:
        std = IMAGENET_STD if chans == 3 else (0.5,) * chans
    if len(mean) != chans or len(std) != chans:
        raise UserValueError(f"mean {list(mean)} and std {list(std)} need one value per input channel ({chans})")
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


class Prepared:
    """The record's fields by name, read-only, on what holds one (``self.preprocessing``): the training task, a
    checkpoint's classifier and its ONNX export's runner, so every reader says ``x.mean``, and only one owns it."""

    preprocessing: Preprocessing

    @property
    def mean(self) -> tuple[float, ...]:
        """Normalisation mean per channel."""
        return self.preprocessing.mean

    @property
    def std(self) -> tuple[float, ...]:
        """Normalisation standard deviation per channel."""
        return self.preprocessing.std

    @property
    def crop_pct(self) -> float:
        """Evaluation centre-crop fraction."""
        return self.preprocessing.crop_pct

    @property
    def interpolation(self) -> str:
        """Resize interpolation."""
        return self.preprocessing.interpolation


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # 0.1's pretrained_preprocessing (vit/_graveyard.py)
