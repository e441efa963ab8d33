"""One pass over every image of a split: what it is (size, mode, format), whether it reads, its hashes and the
small thumbnail that verifies its near-duplicates.

A dataset qualifies by having ``item_name(i)`` and ``raw_image(i)`` (every dataset class in `vit.data` has
them): files are named by their path and first pass the header check that training runs
(`vit.data.io.check_image_file`), then are decoded in full, so truncated files are found too. The work is
spread over processes (fork: the workers inherit the dataset, nothing is pickled).
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from vit.audit.duplicates import content_hash, luma_hashes, phash, window_phashes
from vit.audit.verify import edited, thumbnail
from vit.data.io import check_image_file
from vit.errors import UserValueError
from vit.progress import progress

CHUNK = 64  # images per task: large enough to amortise the hand-off, small enough for a live progress bar


@dataclass
class ImageRecord:
    """What the audit knows about one image. ``problem`` is set (and the rest may be empty) for a bad file."""

    split: str
    index: int  # position in its split's dataset
    name: str  # the file path, or e.g. "digits[12]" for an in-memory dataset
    label: int
    width: int = 0
    height: int = 0
    mode: str = ""
    format: str = ""
    content: str = ""  # `content_hash`
    phash: int = 0
    windows: list[int] = field(default_factory=list)  # `window_phashes`: queries of the near-duplicate search
    thumb: np.ndarray | None = None  # `vit.audit.verify.thumbnail`: what verifies a near-duplicate
    luma: int = 0  # `luma_hashes` of the thumbnail: the other query of the near-duplicate search
    problem: str | None = None


_DATASET: Any = None  # the dataset being scanned, inherited by forked workers


def _describe(index: int, label: int) -> ImageRecord:
    name = _DATASET.item_name(index)
    record = ImageRecord(split="", index=index, name=name, label=label)
    if os.path.isfile(name):  # a file: the header check training runs, before decoding
        record.problem = check_image_file(name)
        if record.problem:
            return record
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = _DATASET.raw_image(index)
        record.width, record.height = img.size
        record.mode, record.format = img.mode, img.format or "in memory"
        record.content, record.phash = content_hash(img), phash(img)
        record.windows, record.thumb = window_phashes(img), thumbnail(img)
        record.luma = luma_hashes(record.thumb[None])[0]
    except Exception as e:  # a file that only decoding finds bad (truncated, damaged)
        record.problem = f"cannot decode ({type(e).__name__}: {e})"
    return record


def _chunk(items: Sequence[tuple[int, int]]) -> list[ImageRecord]:
    return [_describe(index, label) for index, label in items]


def scan_split(dataset: Any, split: str, labels: Sequence[int], num_workers: int = 1) -> list[ImageRecord]:
    """An `ImageRecord` per item of ``dataset`` (labels given, so no item is transformed), in order."""
    global _DATASET
    if not (hasattr(dataset, "item_name") and hasattr(dataset, "raw_image")):
        raise UserValueError(f"vit audit reads images through item_name(i) and raw_image(i), which a "
                             f"{type(dataset).__name__} lacks; add them (see vit.data.folder.ImageFiles)")
    items = list(enumerate(int(label) for label in labels))
    chunks = [items[i:i + CHUNK] for i in range(0, len(items), CHUNK)]
    _DATASET = dataset
    try:
        if num_workers <= 1 or len(chunks) < 2:
            done = progress(map(_chunk, chunks), len(chunks), f"scanning {split}")
            records = [record for chunk in done for record in chunk]
        else:
            with ProcessPoolExecutor(num_workers, mp_context=multiprocessing.get_context("fork")) as pool:
                done = progress(pool.map(_chunk, chunks), len(chunks), f"scanning {split}")
                records = [record for chunk in done for record in chunk]
    finally:
        _DATASET = None
    for record in records:
        record.split = split
    return records


class EditedThumbnails:
    """The thumbnails of ``records``' images through `vit.audit.verify.edited`, made when indexed by an array
    of record indices: only the images of a pair that gets as far as its own bar are read a second time."""

    def __init__(self, records: Sequence[ImageRecord], datasets: dict[str, Any]) -> None:
        self.records, self.datasets = records, datasets

    def __getitem__(self, indices: np.ndarray) -> np.ndarray:
        found = []
        for k in np.asarray(indices).tolist():
            record = self.records[k]
            try:
                found.append(thumbnail(edited(self.datasets[record.split].raw_image(record.index))))
            except Exception:  # gone or damaged since the scan: its own thumbnail, a bar of 1 (the strictest)
                found.append(record.thumb)
        return np.stack(found) if found else np.zeros((0, 3, 32, 32), np.uint8)
