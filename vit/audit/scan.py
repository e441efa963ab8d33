"""One pass over every image of a split: what it is (size, mode, format), whether it reads, its hashes and the
small thumbnail that verifies its near-duplicates.

A dataset qualifies by having ``item_name(i)`` and ``raw_image(i)`` (every dataset class in `vit.data` has
them): files are named by their path and first pass the header check that training runs
(`vit.data.io.check_image_file`), then are decoded in full, so truncated files are found too. The work is
spread over processes (fork: the workers inherit the dataset, nothing is pickled). `cached_scan_split` keeps a
split's records, keyed by the dataset's ``fingerprint()`` and the code that made them, so that an audit run again
on data that has not changed reads no image twice.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import multiprocessing
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import torch
from PIL import Image

from vit.audit import duplicates, verify
from vit.audit.duplicates import content_hash, luma_hashes, phash, window_phashes
from vit.audit.verify import THUMB, edited, thumbnail
from vit.data import io
from vit.data.io import check_image_file
from vit.data.protocol import ReadableImages
from vit.errors import UserValueError
from vit.features import dataset_key
from vit.files import save_atomic
from vit.progress import progress

log = logging.getLogger(__name__)

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
    if not isinstance(dataset, ReadableImages):
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


@functools.cache  # the files do not change under a running audit: read them once, not once per split
def _code_key() -> str:
    """What a record is computed by: this module, the hashes', the thumbnail's, the image reading's and
    Pillow's version. A change to any of them makes earlier caches miss, with no version number to remember."""
    h = hashlib.sha256(PIL.__version__.encode())
    for module in (duplicates, verify, io):
        h.update(Path(module.__file__).read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()


def _cache_path(data: str, split: str, labels: Sequence[int], cache_dir: Path) -> Path:
    """The cache file of the scan of ``split`` of the dataset whose fingerprint is ``data``."""
    h = hashlib.sha256(f"{_code_key()} {data} {split}".encode())
    h.update(np.asarray(labels, dtype=np.int64).tobytes())
    return Path(cache_dir) / f"scan-{split}-{h.hexdigest()[:24]}.pt"


def _to_cache(records: list[ImageRecord]) -> dict[str, Any]:
    # Plain types and one uint8 tensor, so that torch.load(weights_only=True) reads it back.
    thumbs = torch.zeros(len(records), 3, THUMB, THUMB, dtype=torch.uint8)
    for k, record in enumerate(records):
        if record.thumb is not None:
            thumbs[k] = torch.from_numpy(record.thumb)
    return {"records": [{**asdict(record), "thumb": record.thumb is not None} for record in records],
            "thumbs": thumbs}


def _from_cache(saved: dict[str, Any]) -> list[ImageRecord]:
    thumbs = saved["thumbs"].numpy()
    return [ImageRecord(**{**fields, "thumb": thumbs[k].copy() if fields["thumb"] else None})
            for k, fields in enumerate(saved["records"])]


def cached_scan_split(dataset: Any, split: str, labels: Sequence[int], num_workers: int = 1, *,
                      cache_dir: Path | None) -> tuple[list[ImageRecord], str]:
    """`scan_split`'s records from the cache when there, else scanned and cached; and where they came from, in
    words. ``cache_dir=None`` scans and caches nothing."""
    path, uncached = None, ""
    if cache_dir is not None:
        try:
            data = dataset_key(dataset)
        except OSError as e:  # a file gone since the folder was listed: the scan reports it
            data, uncached = None, f" (not cached: {e})"
        else:
            uncached = "" if data is not None else " (not cached: the dataset has no fingerprint())"
        path = None if data is None else _cache_path(data, split, labels, cache_dir)
    if path is not None and path.is_file():
        try:
            return _from_cache(torch.load(path, weights_only=True)), f"loaded from cache {path}"
        except Exception as e:  # unreadable: scan again and overwrite
            log.warning("ignoring unreadable scan cache %s (%s: %s)", path, type(e).__name__, e)
    records = scan_split(dataset, split, labels, num_workers)
    if path is None:
        return records, "scanned" + uncached
    try:
        save_atomic(lambda f: torch.save(_to_cache(records), f), path)
    except OSError as e:  # a read-only or full disk costs the next run time, not this run's findings
        return records, f"scanned, not cached ({type(e).__name__}: {e})"
    return records, f"scanned, cached in {path}"


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
