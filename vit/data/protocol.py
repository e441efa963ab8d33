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
    ImageSplits        a DataModule's classes, splits, loader workers and evaluation view of a split (calibration)
    TableRows          data read from a labels table, whose bad rows can be left out and listed (`vit audit`)
    SplitFolders, FractionSplit, ValSize   how a DataModule holds a test split out (the hint of `vit probe`)
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
    num_workers: int

    def eval_split(self, split: str) -> Any: ...


@runtime_checkable
class TableRows(Protocol):
    """Data read from a labels table (`vit.data.LabelsFile`): ``read()`` gives its usable rows and lists the bad ones
    (``.bad``); ``skip_bad_rows`` leaves those out, listed, instead of stopping."""

    skip_bad_rows: bool

    def read(self) -> Any: ...


@runtime_checkable
class SplitFolders(Protocol):
    """Data under ``root`` that may come as train/, val/ (and test/) folders (``split_folders``)."""

    root: Any
    split_folders: bool


@runtime_checkable
class FractionSplit(Protocol):
    """Data that holds a fraction of its images out as the test split."""

    test_fraction: float | None


@runtime_checkable
class ValSize(Protocol):
    """Data whose val split is a number of images held out of the training images (CIFAR's)."""

    val_size: int


__all__ = [
    "CountsReplacements",
    "EvaluationSplits",
    "Fingerprinted",
    "FractionSplit",
    "ImageFileSamples",
    "ImageSplits",
    "IndexedSubset",
    "LabelledImages",
    "ReadableImages",
    "SplitFolders",
    "TableRows",
    "ValSize",
]
