"""Hugging Face `datasets` data as one more source of the labels-table DataModule: `HFDataset`.

```
root (save_to_disk folder, Parquet folder, hf://owner/name@rev) ─► vit.data.hf / hfrows: a LabelTable of row numbers
   ─► LabelsFile's splits (the data's own, or the seeded stratified split), class counts, multi-label targets
   ─► ArrowImages: a row's bytes from the Arrow buffers ─► ImageFolder's decode and transforms (the fast decoder)
```
`vit fit` reads such a root with this class whichever of ImageFolder or LabelsFile the config names (`vit.cli`), so
every recipe runs on it unchanged. Bad rows (no image, no label, an unknown class, an image whose header does not
read) are reported at setup by split and row in a few lines, or left out with ``skip_bad_rows``; images that fail
to decode later are replaced as ImageFolder's are (``skip_bad_images``).
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image, UnidentifiedImageError

from vit.data.fast import collate
from vit.data.files import ImageFiles
from vit.data.fingerprint import fingerprint
from vit.data.hf import HFSource, find_source
from vit.data.hfrows import ArrowImageColumn, RowNames, by_row, read_hf
from vit.data.hfstream import ArrowStream, StreamLoader
from vit.data.rows import BadRow, LabelTable, describe_bad_rows
from vit.data.seeds import mixed_seed, seed_all
from vit.data.table import LabelsFile, MultiLabelFiles
from vit.errors import UserValueError

log = logging.getLogger(__name__)


class _ArrowRows:
    """What the Arrow datasets share: a row's bytes opened as a file PIL reads, named by its split and row."""

    images: ArrowImageColumn
    names: RowNames
    provenance: dict[str, Any]

    def source(self, path: Any) -> Any:
        data = self.images[int(path)]
        if isinstance(data, str):
            return data
        stream = io.BytesIO(data)  # (one copy of the encoded image; the Arrow buffer stays read-only)
        stream.name = self.names(int(path))  # what an error names
        return stream

    def item_name(self, index: int) -> str:
        """The split and row of item ``index`` in the data."""
        return self.names(int(self.samples[index][0]))

    def fingerprint(self) -> str:
        """The data's name, revision and fingerprint, every item's row and label, and the transform."""
        rows = np.asarray([int(r) for r, _ in self.samples], dtype=np.int64)
        labels = np.asarray([int(x) for _, x in self.samples], dtype=np.int64)
        return fingerprint(type(self).__name__, repr(self.transform), self.provenance, rows, labels)


class ArrowImages(_ArrowRows, ImageFiles):
    """``(row, label)`` samples decoded from the Arrow column's bytes: ImageFiles' decoding, replacement of
    undecodable images and counting, with the bytes of a row where a file would be."""

    def __init__(self, samples: Any, transform: Callable | None, images: ArrowImageColumn, names: RowNames,
                 provenance: dict[str, Any], **kwargs: Any) -> None:
        self.images, self.names, self.provenance = images, names, provenance
        super().__init__(samples, transform, **kwargs)


class MultiLabelArrow(_ArrowRows, MultiLabelFiles):
    """Multi-label ``(row, target row)`` samples decoded from the Arrow column's bytes."""

    def __init__(self, samples: Any, targets: np.ndarray, transform: Callable | None, images: ArrowImageColumn,
                 names: RowNames, provenance: dict[str, Any], **kwargs: Any) -> None:
        self.images, self.names, self.provenance = images, names, provenance
        super().__init__(samples, targets, transform, **kwargs)


class HFDataset(LabelsFile):
    """A Hugging Face dataset: a `save_to_disk` folder (Dataset or DatasetDict), a folder of Parquet files in the
    Hub's layout (data/train-*.parquet, data/validation-*.parquet, data/test-*.parquet, or one split), or
    ``hf://owner/name`` (``@revision``) read from the local Hub cache (HF_HOME).

    The image column is found by type (an Image feature, or bytes) unless named; labels are a ClassLabel (names from
    the feature), strings or ints (names from the data, sorted as class folders are), or a Sequence of ClassLabel /
    lists of strings (multi-label). The data's splits are used (validation or val is val); one split alone is
    split as LabelsFile splits a table (stratified, seeded), so a re-run takes the same split. The data's name,
    revision and fingerprint are logged, kept in checkpoints and named by the model card.

    Args:
        root: the folder, or hf://owner/name[@revision].
        image_column: the column of images (default: the first Image feature, or of image bytes).
        label_column: the column of labels (default: the one ClassLabel, else label, labels, ...).
        path_column: LabelsFile's name for ``image_column`` (either may be given).
        streaming: stream the training rows (`vit.data.hfstream`): every loader worker and DDP rank reads its own
            rows, each row once per epoch, and a run killed mid-epoch resumes at the next batch, bit for bit.
        table, label_columns, separator, split_column: LabelsFile's, unused here.
        classes, multi_label, skip_bad_rows, val_fraction, test_fraction, skip_bad_images, max_bad_fraction,
            check_images, balanced_sampling: as `LabelsFile`'s.
        batch_size: images per batch (per device).
    """

    def __init__(self, root: str, table: str | None = None, path_column: str | None = None,
                 label_column: str | None = None, *, image_column: str | None = None, streaming: bool = False,
                 batch_size: int = 64, **kwargs: Any) -> None:
        super().__init__(root, table, path_column, label_column, batch_size=batch_size, **kwargs)
        self.spec, self.streaming = str(root), streaming
        self.batches_seen = 0  # training batches so far (streaming): the key of each batch's draws on the device
        self._position: tuple[int, int] | None = None  # (epoch, batches trained in it), streaming
        self._train_loader: StreamLoader | None = None
        self.image_column = image_column or path_column
        self._source: HFSource | None = None
        self._images: ArrowImageColumn | None = None
        self._names: RowNames | None = None

    @property
    def source(self) -> HFSource:
        """Where the data is, and which version of it (found on first use)."""
        if self._source is None:
            self._source = find_source(self.spec)
            self.root = self._source.folder
        return self._source

    def read(self) -> LabelTable:
        """Every split's usable rows (read once); bad rows are an error here, or left out and listed."""
        if self._table is None:
            start = time.perf_counter()
            options = self.read_options
            table, self._images, self._names = read_hf(
                self.source, image_column_name=self.image_column, label_column_name=options["label_column"],
                classes=options["classes"], multi_label=options["multi_label"])
            total = len(self._images)
            self._tolerate_bad_rows(table, total)
            p = self.source.provenance()
            kind = f"multi-label, {len(table.class_names)} classes" if table.multi_label else "single-label"
            rank_zero_info(f"read {p['name']} ({p['kind']}, revision {p['revision'] or '-'}, fingerprint "
                           f"{p['fingerprint']}): {total:,} rows in {time.perf_counter() - start:.1f} s ({table.how}; "
                           f"{kind})")
            if not table.paths:
                raise UserValueError(f"{self.spec}: no usable rows, so nothing to train on: every row is bad")
            self._table = table
        return self._table

    def _tolerate_bad_rows(self, table: LabelTable, total: int) -> None:
        if not table.bad:
            return
        report = describe_bad_rows(self.spec, table.bad, total, by_row)
        if not self.skip_bad_rows:
            raise UserValueError(f"{report}\nFix or remove these rows, or set data.skip_bad_rows: true to train "
                                 "without them.")
        log.warning("leaving out %s", report)

    def image_source(self, path: Any) -> Any:
        """A row's image bytes, openable by PIL (what img_size auto reads)."""
        return ArrowImages([], None, self._images, self._names, {}).source(path)

    def _without_bad_files(self, splits: dict[str, list[tuple[Any, Any]]]) -> dict[str, list[tuple[Any, Any]]]:
        """Check every row's image header from its bytes; raise, or leave the bad rows out, listing them."""
        start = time.perf_counter()
        rows = [row for samples in splits.values() for row, _ in samples]
        probe = ArrowImages([], None, self._images, self._names, {})
        bad = [BadRow(int(r), "undecodable image", f"{self._names(int(r))}: {problem}") for r in rows
               if (problem := _header_problem(probe.source(r))) is not None]
        rank_zero_info(f"checked {len(rows)} image headers in {time.perf_counter() - start:.1f} s")
        if not bad:
            return splits
        report = describe_bad_rows(self.spec, bad, len(rows), by_row)
        if not self.skip_bad_images:
            raise UserValueError(f"{report}\nFix or remove these rows, or set data.skip_bad_images: true to train "
                                 "without them.")
        log.warning("leaving out %s", report)
        gone = {b.line for b in bad}
        return {name: [s for s in samples if int(s[0]) not in gone] for name, samples in splits.items()}

    def dataset(self, samples: list[tuple[Any, Any]], transform: Callable, **kwargs: Any) -> ImageFiles:
        self.read()
        common = dict(replace_bad=self.skip_bad_images, max_bad_fraction=self.max_bad_fraction, **kwargs)
        if self.multi_label:
            return MultiLabelArrow(samples, self.read().targets, transform, self._images, self._names,
                                   self.source.provenance(), **common)
        return ArrowImages(samples, transform, self._images, self._names, self.source.provenance(), **common)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            super().setup(stage)
            if self.streaming:
                self.train_set = ArrowStream(self.train_set, self.seed, self.batch_size)

    def without_augmentation(self, dataset: Any) -> Any:
        return super().without_augmentation(dataset.dataset if isinstance(dataset, ArrowStream) else dataset)

    def train_dataloader(self) -> Any:
        """Map-style as ImageFolder's; streaming, a `StreamLoader` at this rank's rows and any restored position."""
        if not self.streaming:
            return super().train_dataloader()
        stream: ArrowStream = self.train_set
        stream.rank, stream.world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        self._train_loader = StreamLoader(stream, num_workers=self.num_workers, collate_fn=collate,
                                          pin_memory=torch.cuda.is_available())
        self._train_loader.resume = self._position
        return self._train_loader

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Streaming: count the batch, and seed the device's draws (erasing, mixup, drop path) from (seed, rank,
        batches so far), so a resumed run draws what an uninterrupted one did (as `vit.data.stream` does)."""
        if self.streaming and self.trainer is not None and self.trainer.training:
            stream: ArrowStream = self.train_set
            epoch, done = self._position or (-1, 0)
            self._position = (stream.epoch, done + 1 if epoch == stream.epoch else stream.skip + 1)
            seed_all(mixed_seed(self.seed, self.trainer.global_rank, self.batches_seen))
            self.batches_seen += 1
        return super().on_after_batch_transfer(batch, dataloader_idx)

    def state_dict(self) -> dict[str, Any]:
        """Kept in checkpoints: where the data came from (the model card names it), and when streaming, the
        training position."""
        state: dict[str, Any] = {**super().state_dict(), "data_source": self.source.provenance()}  # (+ the pool's)
        if self.streaming:
            state.update(batches_seen=self.batches_seen, position=self._position)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Streaming: the position to resume at (Lightning restores DataModules before the loop's first epoch)."""
        super().load_state_dict(state_dict)  # an unlabelled pool's position
        self.batches_seen = int(state_dict.get("batches_seen", 0))
        position = state_dict.get("position")
        self._position = tuple(position) if position is not None else None
        if self._train_loader is not None:  # built already (for the scheduler's step count)
            self._train_loader.resume = self._position


def _header_problem(source: Any) -> str | None:
    """What is wrong with an encoded image, from its header alone, or None."""
    try:
        with Image.open(source):
            pass
    except UnidentifiedImageError:
        return "not an image in a format PIL reads"
    except Exception as e:  # PIL raises several types for bad data; all mean the same to a user
        return f"unreadable header ({type(e).__name__}: {e})"
    return None
