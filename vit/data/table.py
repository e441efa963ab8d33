"""Labels from a file: a CSV, TSV or JSONL of image paths and labels, one label per image or several.

`LabelsFile` is `ImageFolder` with its class folders read from a table instead (`vit.data.rows`): the header
check, bad-file handling (``skip_bad_images``), EXIF orientation, the fast decode at the crop's scale, audit,
preprocessing and every recipe's transforms are ImageFolder's own, so a table listing a class-folder tree gives
the same run. Items are ``(image, int label)`` for single-label data, and ``(image, float (C,))`` for multi-label
data: 1.0 or 0.0 per class, and -1.0 where the table says "unknown" (masked out of the loss).

    table ─► read_table (rows, bad rows) ─► split column, or a seeded stratified split ─► ImageFiles / MultiLabelFiles
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import Sampler

from vit.data.files import ImageFiles
from vit.data.fingerprint import fingerprint
from vit.data.folder import ImageFolder
from vit.data.io import require_folder, stratified_split
from vit.data.rows import TABLE_SUFFIXES, LabelTable, describe_bad_rows, find_table, read_table
from vit.data.stratify import iterative_split
from vit.errors import UserValueError

log = logging.getLogger(__name__)


class MultiLabelFiles(ImageFiles):
    """``(path, row)`` samples whose targets are rows of one shared (N, C) int8 table (1, 0, -1 for unknown);
    items are ``(image, float32 (C,))``. The table is shared by the splits: one int8 per class and row."""

    def __init__(self, samples: Sequence[tuple[str, int]], targets: np.ndarray, transform: Callable | None = None,
                 **kwargs: Any) -> None:
        self.targets = targets
        super().__init__(samples, transform, **kwargs)

    def group(self, label: Any) -> Any:
        """Any image may stand in for an undecodable one: it brings its own labels."""
        return 0

    def __getitem__(self, index: int) -> tuple[Any, Tensor]:
        image, row = super().__getitem__(index)
        return image, torch.from_numpy(self.targets[row].astype(np.float32))

    @property
    def labels(self) -> Tensor:
        """(N, C) float targets of every item, without decoding: 1, 0, or -1 for unknown."""
        return torch.from_numpy(self.targets[[row for _, row in self.samples]].astype(np.float32))

    def fingerprint(self) -> str:
        """The files' fingerprint, and every item's targets."""
        return fingerprint(super().fingerprint(), self.targets[[row for _, row in self.samples]])


class LabelsFile(ImageFolder):
    """Images listed in a labels table: CSV, TSV or JSONL, beside the images or anywhere.

    The table is ``table`` (relative to ``root`` unless absolute), or Hugging Face imagefolder's
    ``root/metadata.csv`` or ``metadata.jsonl``; ``root`` may also be the table itself. Image paths are relative
    to the table's folder unless absolute. Columns default to the common names: the path in ``file_name``,
    ``path`` or ``image``; the labels in ``label``, ``labels`` or ``tags`` (one per row, or several joined by
    ``separator``, or a JSONL list); with no such column, every other column is one class's 0/1 column, where
    blank or -1 means unknown. A ``split`` column (train / val / test) gives the splits; without one, a seeded
    split keeps each label's share in every part (iterative stratification for multi-label data).

    Bad rows (a missing file, an unknown class, an empty label cell, one path with two sets of labels, a path
    leaving the table's folder, a malformed line) are all reported at setup with their line numbers: an error,
    or with ``skip_bad_rows`` left out (``skip_bad_images`` leaves out missing files too).

    Args:
        root: the folder of the images and, by default, the table; or the table file.
        table: the labels table, when it is not root/metadata.csv or root/metadata.jsonl.
        path_column: the column of image paths (default: file_name, path, image, ...).
        label_column: the column of labels (default: label, labels, tags, ...).
        label_columns: the per-class 0/1 columns, in class order (default: every other column, when no label
            column is found).
        separator: what joins several labels in one cell (default: the first of ";", "|", "," found in a cell;
            "" for none; a space must be given).
        classes: the fixed class list: a label outside it is a bad row (default: every label found, sorted).
        multi_label: true, false, or null to infer (true when a row has several labels or the labels are per-class
            columns).
        split_column: the column naming each row's split (absent: a seeded split by val_fraction, test_fraction).
        skip_bad_rows: leave out bad rows (listed) instead of stopping.
        val_fraction, test_fraction, skip_bad_images, max_bad_fraction, check_images, balanced_sampling:
            as `ImageFolder`'s.
        batch_size: images per batch (per device).
    """

    def __init__(
        self,
        root: str,
        table: str | None = None,
        path_column: str | None = None,
        label_column: str | None = None,
        label_columns: list[str] | None = None,
        separator: str | None = None,
        classes: list[str] | None = None,
        multi_label: bool | None = None,
        split_column: str | None = "split",
        skip_bad_rows: bool = False,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        skip_bad_images: bool = False,
        max_bad_fraction: float = 0.01,
        check_images: bool = True,
        balanced_sampling: bool = False,
        *,
        batch_size: int = 64,
        **kwargs: Any,
    ) -> None:
        super().__init__(root, val_fraction, test_fraction, skip_bad_images, max_bad_fraction, check_images,
                         balanced_sampling, batch_size=batch_size, **kwargs)
        if table is None and self.root.name.lower().endswith(TABLE_SUFFIXES) and self.root.is_file():
            self.root, table = self.root.parent, self.root.name
        self.table = table
        self.read_options = dict(path_column=path_column, label_column=label_column, label_columns=label_columns,
                                 separator=separator, classes=classes, multi_label=multi_label,
                                 split_column=split_column)
        self.skip_bad_rows = skip_bad_rows
        self._table: LabelTable | None = None

    def read(self) -> LabelTable:
        """The table's usable rows (read once); bad rows are an error here, or left out and listed."""
        if self._table is None:
            require_folder(self.root)
            path = find_table(self.root, self.table)
            start = time.perf_counter()
            table = read_table(path, check_files=True, root=self.root, **self.read_options)
            total = len(table.paths) + len(table.bad) + table.repeated
            self._tolerate_bad_rows(table, total)  # (before the log line: an error stays within its ten lines)
            kind = f"multi-label, {len(table.class_names)} classes" if table.multi_label else "single-label"
            rank_zero_info(f"read {path}: {total:,} rows in {time.perf_counter() - start:.1f} s ({table.how}; {kind})"
                           + (f"; {table.repeated:,} repeated rows kept once" if table.repeated else ""))
            if not table.paths:
                raise UserValueError(f"{path}: no usable rows, so nothing to train on: every row is bad or the "
                                     "table lists no image")
            self._table = table
        return self._table

    def _tolerate_bad_rows(self, table: LabelTable, total: int) -> None:
        """Raise on bad rows, unless skip_bad_rows (or, for missing files alone, skip_bad_images) leaves them out."""
        if not table.bad:
            return
        report = describe_bad_rows(table.path, table.bad, total)
        only_files = all(b.kind == "missing file" for b in table.bad)
        if not (self.skip_bad_rows or (only_files and self.skip_bad_images)):
            raise UserValueError(f"{report}\nFix or remove these rows, or set data.skip_bad_rows: true to train "
                                 "without them.")
        log.warning("leaving out %s", report)

    @property
    def multi_label(self) -> bool:
        """Whether items carry (C,) float targets (several labels per image) rather than one class."""
        return self.read().multi_label

    def _read_layout(self) -> list[str]:
        self._split_folders = False
        names = self.read().class_names
        if len(names) < 2 and not self.multi_label:
            raise UserValueError(f"a classifier needs at least two classes; {self.read().path} names one: {names}")
        return names

    def splits(self) -> dict[str, list[tuple[str, Any]]]:
        """(path, label) samples of train, val and (when there is one) test; multi-label samples carry their row."""
        table = self.read()
        keys = range(len(table.paths)) if table.multi_label else table.labels
        samples = list(zip(table.paths, keys))
        if table.splits is None:
            fractions = [self.val_fraction] + ([self.test_fraction] if self.test_fraction > 0 else [])
            parts = self._split(np.arange(len(samples)), fractions)
            return {name: [samples[i] for i in idx] for name, idx in zip(("train", "val", "test"), parts)}
        found = {name: [s for s, split in zip(samples, table.splits) if split == name]
                 for name in ("train", "val", "test")}
        if not found["train"]:
            raise UserValueError(f"{table.path}: no row of split train, so nothing to train on")
        if not found["test"]:
            del found["test"]
        if not found["val"]:  # train (and test) alone: val is held out of train, as ImageFolder does
            rows = np.array([i for i, split in enumerate(table.splits) if split == "train"])
            rest, val = self._split(rows, [self.val_fraction])
            found["train"], found["val"] = [samples[i] for i in rest], [samples[i] for i in val]
            rank_zero_info(f"{table.path} has no val rows: {self.val_fraction:g} of train is held out for "
                           "validation (stratified, seeded)")
        return found

    def _split(self, rows: np.ndarray, fractions: Sequence[float]) -> list[np.ndarray]:
        """The table's ``rows`` split by ``fractions``, keeping each label's share: rows, not positions."""
        table = self.read()
        if table.multi_label:
            parts = iterative_split(table.targets[rows], fractions, self.seed)
        else:
            parts = stratified_split([table.labels[i] for i in rows], fractions, self.seed)
        return [rows[p] for p in parts]

    def dataset(self, samples: list[tuple[str, Any]], transform: Callable, **kwargs: Any) -> ImageFiles:
        if not self.multi_label:
            return super().dataset(samples, transform, **kwargs)
        return MultiLabelFiles(samples, self.read().targets, transform, replace_bad=self.skip_bad_images,
                               max_bad_fraction=self.max_bad_fraction, **kwargs)

    def class_counts(self, split: str = "train") -> list[int]:
        """Images per class in a split (after ``setup``); for multi-label data, the images that have the label."""
        if not self.multi_label:
            return super().class_counts(split)
        dataset = getattr(self, f"{split}_set", None)
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__} has no {split} split; was setup() called?")
        return (dataset.labels > 0).sum(0).tolist()

    def train_sampler(self) -> Sampler | None:
        if self.balanced_sampling and self.multi_label:
            raise UserValueError("data.balanced_sampling weights images by their one class; multi-label images have "
                                 "several: leave it off (per-class positive weights in the loss do this job)")
        return super().train_sampler()
