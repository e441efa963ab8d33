"""What a dataset offers, stated once: the Protocols the DataModules' splits and the DataModules themselves follow.

Every consumer (`vit audit`, int8 calibration, the held-out test check, the feature cache, the trainer's
report of replaced images) asks ``isinstance(x, Protocol)`` here instead of probing attributes one by one, so a
new dataset knows from one file what to offer for each feature. Imports no Lightning.

    LabelledImages     (image, label) items, the labels without decoding, the transform the DataModule swaps
    ReadableImages     + each item's name and its image as stored (audit, calibration)
    ImageFileSamples   + the (path, label) samples on disk (which files a split holds)
    IndexedSubset      a subset of one dataset by indices (CIFAR's splits)
    Fingerprinted      a split that hashes what it holds (the feature cache's key)
    CountsReplacements a split that replaces undecodable files and counts them
    EvaluationSplits   data with val and test splits (the held-out test check)
    ImageSplits        a DataModule's classes, splits and evaluation view of a split
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class LabelledImages(Protocol):
    """A split of labelled images: ``(image, label)`` items, every label without decoding an image, and the
    ``transform`` the DataModule swaps for its evaluation transform (`ImageDataModule.without_augmentation`)."""

    transform: Callable | None

    @property
    def labels(self) -> Sequence[int]: ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[Any, int]: ...


@runtime_checkable
class ReadableImages(Protocol):
    """A split whose items can be named and read as stored, untransformed: what `vit audit` scans and int8
    calibration prepares the checkpoint's way (`vit.data.folder.ImageFiles`, CIFAR's and the digits' splits)."""

    def item_name(self, index: int) -> str: ...

    def raw_image(self, index: int) -> Any: ...


@runtime_checkable
class ImageFileSamples(Protocol):
    """A split of image files: its ``(path, label)`` samples."""

    samples: Sequence[tuple[str | os.PathLike, int]]


@runtime_checkable
class IndexedSubset(Protocol):
    """A split that is a subset of one underlying dataset, by ``indices`` (CIFAR's train/val split)."""

    dataset: Any
    indices: Sequence[int]


@runtime_checkable
class Fingerprinted(Protocol):
    """A split that can say what it holds in one hash (its files or images, labels and transform): the key of the
    feature cache of `vit probe` and `vit audit`."""

    def fingerprint(self) -> str: ...


@runtime_checkable
class CountsReplacements(Protocol):
    """A split that replaces undecodable files by others of their class, and counts them across loader workers."""

    def replacements(self) -> tuple[int, list[str]]: ...


@runtime_checkable
class EvaluationSplits(Protocol):
    """Data with a validation and a test split (``None`` when it has none): what the held-out test check compares."""

    val_set: Any
    test_set: Any


@runtime_checkable
class ImageSplits(EvaluationSplits, Protocol):
    """An image DataModule after ``setup``: its classes, its three splits (``None`` when it has none), and a split
    as evaluation sees it (the training split without augmentation)."""

    class_names: list[str]
    train_set: Any

    def eval_split(self, split: str) -> Any: ...


__all__ = [
    "CountsReplacements",
    "EvaluationSplits",
    "Fingerprinted",
    "ImageFileSamples",
    "ImageSplits",
    "IndexedSubset",
    "LabelledImages",
    "ReadableImages",
]
