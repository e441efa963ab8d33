"""Your own images in class folders, and ImageNet in the same layout.

Bad files are found early and cheaply: at setup every file's header is checked (in parallel, and
sharded across DDP ranks), so empty files, non-images and absurd sizes are all reported at once,
before the first step. What only decoding finds (truncated data) is caught when the image loads:
an error naming the file, or with ``skip_bad_images`` a replacement from the same class, counted.
"""

from __future__ import annotations

import logging
import os
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from torch.utils.data import Dataset, Sampler

from vit.data.balance import balanced_sampler, report_class_counts
from vit.data.base import ImageDataModule, no_test_reason
from vit.data.files import ImageFiles, check_headers
from vit.data.io import (
    class_folders,
    describe_bad_files,
    has_split_folders,
    require_folder,
    require_two_classes,
    scan_class_folders,
    stratified_split,
)
from vit.data.pool import UnlabelledPool
from vit.data.rows import HF_TABLES, tables_in
from vit.data.sizing import SAMPLE, auto_img_size, short_sides
from vit.errors import UserPathError, UserValueError
from vit.preprocessing import eval_short_side

log = logging.getLogger(__name__)


# The names a validation split's folder goes by: "valid" in Roboflow's exports, "validation" in some Kaggle sets.
VAL_FOLDERS = ("val", "valid", "validation")


def nfc(name: str) -> str:
    """``name`` in Unicode's composed form (NFC): macOS's HFS+ and zips made there store names decomposed."""
    return unicodedata.normalize("NFC", name)


class ImageFolder(UnlabelledPool, ImageDataModule):
    """Your own images: ``root/<class>/<image>`` split into train/val/test by ``val_fraction`` and
    ``test_fraction`` (stratified, seeded; 80/10/10 by default),
    or ``root/train/<class>/...`` and ``root/val/<class>/...`` (``valid/`` or ``validation/``; without one,
    ``val_fraction`` of train/ is held out) and optionally ``root/test/``.

    Images of any common mode (grayscale, palette, RGBA, CMYK, 16-bit) become RGB. Files that are
    not images (by extension) are skipped with one warning. At setup every image's header is checked;
    bad files are an error that lists them all, or with ``skip_bad_images`` are left out and listed.
    With ``test_fraction: 0`` (or split folders without test/) there is no test split: `vit test` then runs on
    val, and `vit fit` reports val figures, labelled as such.

    Args:
        root: the dataset folder.
        val_fraction: share of each class held out for validation (single-folder layout, or train/ without val/).
        test_fraction: share of each class held out for test (single-folder layout only).
        skip_bad_images: leave out files whose header is bad, and replace images that fail to decode
            during training by another of their class (counted and reported every epoch).
        max_bad_fraction: with skip_bad_images, stop when more than this share of a split fails to
            decode (at least one file is tolerated, however small the split).
        check_images: check every file's header at setup (cheap: no decoding); off trusts the files.
        balanced_sampling: draw training images with weights 1 / (images of their class), so every class
            comes up about equally often (works under DDP: Lightning shards the draws across ranks).
        batch_size: images per batch (per device).
        unlabelled_root: a folder of unlabelled images (any depth) read beside the labelled ones, for a task
            that reads them (distillation, semi-supervised): `vit.data.pool`.
        unlabelled_ratio: pool images per labelled image in a step; None reads the whole pool once an epoch.
    """

    def __init__(
        self,
        root: str,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        skip_bad_images: bool = False,
        max_bad_fraction: float = 0.01,
        check_images: bool = True,
        balanced_sampling: bool = False,
        *,
        batch_size: int = 64,
        unlabelled_root: str | None = None,
        unlabelled_ratio: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(batch_size=batch_size, **kwargs)
        self.init_pool(unlabelled_root, unlabelled_ratio)
        # Values only: the folder is read on first use (`class_names`, `setup`), so a wrong root is a plain
        # error from the command rather than a config-validation failure inside jsonargparse.
        if not 0 < val_fraction < 1 or not 0 <= test_fraction < 1 or val_fraction + test_fraction >= 1:
            raise UserValueError(
                f"val_fraction ({val_fraction}) must be in (0, 1) and test_fraction ({test_fraction}) in [0, 1), "
                "leaving images for training"
            )
        self.root = Path(root).expanduser()  # a YAML value or `--root=~/photos` reaches us unexpanded
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.skip_bad_images, self.max_bad_fraction, self.check_images = skip_bad_images, max_bad_fraction, check_images
        self.balanced_sampling = balanced_sampling
        self._split_folders: bool | None = None

    sizes_from_images = True

    @property
    def img_size(self) -> int:
        """The side the model sees; "auto" is read from the training images on first use (`vit.data.sizing`)."""
        if self._img_size == "auto":
            self._img_size = auto_img_size(self.image_sides())
            rank_zero_info(f"img_size auto: {self._img_size} (the training images' typical side, within 32-64)")
        return self._img_size

    def image_sides(self) -> list[int]:
        """The short sides of up to SAMPLE training images spread over the split, read once (headers only)."""
        if getattr(self, "_sides", None) is None:
            train = self.splits()["train"]
            self._sides = short_sides([self.image_source(path) for path, _ in train[::max(1, len(train) // SAMPLE)]])
        return self._sides

    @img_size.setter
    def img_size(self, value: int | str) -> None:
        self._img_size = value

    @property
    def class_names(self) -> list[str]:
        """The class folders' names (train/'s in the split layout), read from ``root`` on first use."""
        if not self._class_names:
            self._class_names = self._read_layout()
        return self._class_names

    @class_names.setter
    def class_names(self, names: Sequence[str]) -> None:
        self._class_names = list(names)

    @property
    def split_folders(self) -> bool:
        """Whether ``root`` holds train/ and val/ (and maybe test/) folders, rather than class folders."""
        if self._split_folders is None:
            self._class_names = self._read_layout()
        return bool(self._split_folders)

    def _read_layout(self) -> list[str]:
        """Check ``root``'s layout and return its class names."""
        require_folder(self.root)
        self._split_folders = has_split_folders(self.root)
        if not self._split_folders:
            if table := table_without_classes(self.root):
                raise UserValueError(f"{self.root} holds a labels table, {table}, and no class folders: read it with "
                                     f"--data vit.data.LabelsFile --data.init_args.root {self.root}"
                                     + ("" if table in HF_TABLES else f" --data.init_args.table {table}"))
            class_names = class_folders(self.root)
            require_two_classes(self.root, class_names)
            return class_names
        class_names = class_folders(self.root / "train")
        require_two_classes(self.root / "train", class_names)
        for split in ("val", "test"):
            if (folder := self.split_folder(split)) is not None:
                extra = sorted({nfc(c) for c in class_folders(folder)} - {nfc(c) for c in class_names})
                if extra:
                    raise UserValueError(f"{folder} has classes that {self.root / 'train'} lacks: {extra}")
        return class_names

    def split_folder(self, split: str) -> Path | None:
        """The folder of ``split`` ("train", "val" or "test") in the split layout, or None: val/ may be named
        valid/ or validation/ (`VAL_FOLDERS`)."""
        names = VAL_FOLDERS if split == "val" else (split,)
        return next((self.root / name for name in names if (self.root / name).is_dir()), None)

    def _scan(self, folder: Path, allow_empty: bool = False) -> list[tuple[str, int]]:
        present = class_folders(folder)
        # val/test may lack some classes (a folder, or its images); labels always follow train's class list.
        # by name as displayed: a folder unzipped from a Mac may spell "café" decomposed (NFD) where train/ has NFC
        label = {nfc(name): i for i, name in enumerate(self.class_names)}
        remap = [label[nfc(name)] for name in present]
        return [(path, remap[label]) for path, label in scan_class_folders(folder, present, allow_empty=allow_empty)]

    def splits(self) -> dict[str, list[tuple[str, int]]]:
        """(path, label) samples of train, val and (when there is one) test."""
        if self.split_folders:
            found = {name: self._scan(folder, allow_empty=name != "train")
                     for name in ("train", "val", "test") if (folder := self.split_folder(name)) is not None}
            if "val" not in found:  # train/ (and test/) alone, as many datasets come: val is held out of train/
                train = found["train"]
                rest, val = stratified_split([label for _, label in train], [self.val_fraction], self.seed)
                found["train"], found["val"] = [train[i] for i in rest], [train[i] for i in val]
                rank_zero_info(f"{self.root} has no val/ folder: {self.val_fraction:g} of each class of train/ is "
                               "held out for validation (stratified, seeded)")
            return found
        samples = self._scan(self.root)
        fractions = [self.val_fraction] + ([self.test_fraction] if self.test_fraction > 0 else [])
        parts = stratified_split([label for _, label in samples], fractions, self.seed)
        return {name: [samples[i] for i in idx] for name, idx in zip(("train", "val", "test"), parts)}

    def _without_bad_files(self, splits: dict[str, list[tuple[str, int]]]) -> dict[str, list[tuple[str, int]]]:
        """Check every header once (sharded across DDP ranks); raise, or drop the bad files, listing them."""
        paths = [path for samples in splits.values() for path, _ in samples]
        start = time.perf_counter()
        # the evaluation resize's short side bounds the training crop's too (an image smaller than the crop is
        # enlarged to it): an image that either would blow up past MAX_RESIZED_PIXELS is named here
        bad = dict(check_headers(paths, self.eval_short_side()))
        rank_zero_info(f"checked {len(paths)} image headers in {time.perf_counter() - start:.1f} s")
        if not bad:
            return splits
        report = describe_bad_files(sorted(bad.items()), len(paths))
        if not self.skip_bad_images:
            raise UserValueError(f"{self.root}: {report}\nRemove or fix them, or set data.skip_bad_images: true "
                             "to train without them.")
        log.warning("%s: leaving out %s", self.root, report)
        return {name: [s for s in samples if s[0] not in bad] for name, samples in splits.items()}

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        splits = self.splits()
        if self.check_images:
            splits = self._without_bad_files(splits)
        if not splits["val"]:
            counts = Counter(label for _, label in splits["train"])
            single = sum(1 for n in counts.values() if n == 1)
            why = (f"a class needs two images to give one to validation, and {single} of the {len(counts)} classes "
                   "have one") if not self.split_folders else "its validation folder holds no images"
            raise UserValueError(f"{self.root}: no image is left to validate on ({why}); add images, or give a "
                                 f"{self.root}/val/<class>/<images> folder")
        train_tf, eval_tf = self.train_transform(), self.eval_transform()
        make = self.dataset
        short_side = self.eval_short_side()
        self.train_set = make(splits["train"], train_tf)
        self.val_set = make(splits["val"], eval_tf, short_side=short_side)
        self.test_set = make(splits["test"], eval_tf, short_side=short_side) if "test" in splits else self.val_set
        test = "no test (val stands in for it)" if no_test_reason(self) else f"{len(self.test_set)} test"
        rank_zero_info(f"{self.root}: {len(self.train_set)} train, {len(self.val_set)} val, {test} images, "
                       f"{self.num_classes} classes")
        self._report_class_counts()

    def image_source(self, path: Any) -> Any:
        """What a sample's path opens as (with PIL): the file; a Hugging Face row's bytes in `vit.data.hub`."""
        return path

    def dataset(self, samples: list[tuple[str, Any]], transform: Callable, **kwargs: Any) -> ImageFiles:
        """One split of ``samples`` (setup's), reading files as this DataModule's options say."""
        return ImageFiles(samples, transform, replace_bad=self.skip_bad_images, max_bad_fraction=self.max_bad_fraction,
                          **kwargs)

    def eval_short_side(self) -> int:
        """What the evaluation transform resizes the short side to: a large JPEG decodes at that scale, as
        `vit predict` and `vit serve` decode it (`vit.data.io.load_image`)."""
        return eval_short_side((self.img_size,), self.crop_pct)

    def without_augmentation(self, dataset: Dataset) -> Dataset:
        plain = super().without_augmentation(dataset)
        plain.short_side = self.eval_short_side()  # the training images as val and test are decoded
        return plain

    def test_dataloader(self) -> Any:
        # `vit test` asked for it: say what the test_* figures really are (a log line, once, not a Python warning)
        # (Only once set up: LightningDataModule.__str__ calls every loader method, set up or not.)
        if self.test_set is not None and rank_zero_only.rank == 0 and no_test_reason(self):
            log.warning("%s: no test split is held out (test_fraction 0, or no test/ folder), so the test_* "
                        "figures below are on the val images, which chose the checkpoint", self.root)
        return super().test_dataloader()

    def _report_class_counts(self) -> None:
        report_class_counts(self.root, self.class_names, self.class_counts("train"),
                            getattr(self, "multi_label", False), balanced=bool(self.balanced_sampling))

    def train_sampler(self) -> Sampler | None:
        """With ``balanced_sampling``, every class drawn about equally often (`vit.data.balance`)."""
        if not self.balanced_sampling:
            return None
        return balanced_sampler(self.class_counts("train"), self.train_set.labels)


def table_without_classes(root: Path) -> str | None:
    """The labels table (CSV, TSV, JSONL) of a ``root`` with fewer than two class folders (``images/`` beside a
    ``labels.csv``), HF's metadata.csv first; None otherwise."""
    tables = tables_in(root)
    if not tables:
        return None
    with os.scandir(root) as entries:
        if sum(1 for e in entries if e.is_dir() and not e.name.startswith(".")) >= 2:
            return None
    return next((t for t in HF_TABLES if t in tables), tables[0])


class ImageNet(ImageFolder):
    """ImageNet-1k (or any dataset) in the ``root/train/<class>/`` + ``root/val/<class>/`` layout
    that timm and torchvision's ImageFolder use, with DeiT's augmentation as defaults.

    Args:
        root: the dataset folder, holding train/ and val/.
        batch_size: images per batch (per device).
        num_workers: DataLoader worker processes (per device).
        color_jitter: colour-jitter strength (DeiT's 0.3; timm skips it when auto_augment is set).
    """

    def __init__(
        self,
        root: str,
        skip_bad_images: bool = False,
        *,
        batch_size: int = 128,
        num_workers: int = 8,
        color_jitter: float = 0.3,
        **kwargs: Any,
    ) -> None:
        super().__init__(root, skip_bad_images=skip_bad_images, batch_size=batch_size, num_workers=num_workers,
                         color_jitter=color_jitter, **kwargs)

    def _read_layout(self) -> list[str]:
        for split in ("train", "val"):
            if self.split_folder(split) is None:
                raise UserPathError(
                    f"ImageNet folder {self.root / split} not found; expected {self.root}/train/<class>/*.JPEG "
                    f"and {self.root}/val/<class>/*.JPEG (the layout of timm and torchvision's ImageFolder)"
                )
        return super()._read_layout()
