"""Your own images in class folders, and ImageNet in the same layout."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from vit.data.base import ImageDataModule
from vit.data.io import class_folders, load_image, scan_class_folders, stratified_split

log = logging.getLogger(__name__)


class ImageFiles(Dataset):
    """(path, label) samples decoded to RGB and transformed; a bad file's error names it."""

    def __init__(self, samples: Sequence[tuple[str, int]], transform: Callable | None = None) -> None:
        self.samples = list(samples)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        img = load_image(path)
        return (self.transform(img) if self.transform else img), label


class ImageFolder(ImageDataModule):
    """Your own images: ``root/<class>/<image>`` split by ``val_fraction`` (stratified, seeded),
    or ``root/train/<class>/...`` and ``root/val/<class>/...`` (and optionally ``root/test/``).

    Images of any common mode (grayscale, palette, RGBA, CMYK, 16-bit) become RGB. Files that are
    not images are skipped with one warning. A corrupt image raises an error naming it when it is
    loaded, or, with ``skip_bad_images``, is found by decoding every image once at setup and skipped.
    Without a ``test/`` folder, testing uses ``test_fraction`` of a single folder, or else val.

    Args:
        root: the dataset folder.
        val_fraction: share of each class held out for validation (single-folder layout only).
        test_fraction: share of each class held out for test (single-folder layout only).
        skip_bad_images: skip unreadable images instead of failing on them.
        batch_size: images per batch (per device).
    """

    def __init__(
        self,
        root: str,
        val_fraction: float = 0.2,
        test_fraction: float = 0.0,
        skip_bad_images: bool = False,
        *,
        batch_size: int = 64,
        **kwargs: Any,
    ) -> None:
        super().__init__(batch_size=batch_size, **kwargs)
        self.root = Path(root)
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.skip_bad_images = skip_bad_images
        if not self.root.is_dir():
            raise FileNotFoundError(f"image folder not found: {self.root}")
        self.split_folders = (self.root / "train").is_dir()
        if self.split_folders:
            self.class_names = class_folders(self.root / "train")
            if not (self.root / "val").is_dir():
                raise FileNotFoundError(
                    f"{self.root} has train/ but no val/ folder; expected {self.root}/val/<class>/<images>"
                )
            for split in ("val", "test"):
                if (self.root / split).is_dir():
                    extra = sorted(set(class_folders(self.root / split)) - set(self.class_names))
                    if extra:
                        raise ValueError(
                            f"{self.root / split} has classes that {self.root / 'train'} lacks: {extra}"
                        )
        else:
            if not 0 < val_fraction < 1 or not 0 <= test_fraction < 1 or val_fraction + test_fraction >= 1:
                raise ValueError(
                    f"val_fraction ({val_fraction}) and test_fraction ({test_fraction}) must be in [0, 1) "
                    "and leave images for training"
                )
            self.class_names = class_folders(self.root)

    def _scan(self, folder: Path) -> list[tuple[str, int]]:
        present = class_folders(folder)
        # val/test may lack some classes; labels always follow train's class list.
        samples = scan_class_folders(folder, present)
        if self.skip_bad_images:
            samples = self._readable(samples)
        remap = [self.class_names.index(name) for name in present]
        return [(path, remap[label]) for path, label in samples]

    @staticmethod
    def _readable(samples: list[tuple[str, int]]) -> list[tuple[str, int]]:
        import warnings

        kept, bad = [], []
        for path, label in samples:
            try:
                load_image(path)
                kept.append((path, label))
            except OSError:
                bad.append(path)
        if bad:
            shown = ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else "")
            warnings.warn(f"skipped {len(bad)} unreadable images: {shown}", stacklevel=2)
        return kept

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train_tf, eval_tf = self.train_transform(), self.eval_transform()
        if self.split_folders:
            self.train_set = ImageFiles(self._scan(self.root / "train"), train_tf)
            self.val_set = ImageFiles(self._scan(self.root / "val"), eval_tf)
            test_dir = self.root / "test"
            self.test_set = ImageFiles(self._scan(test_dir), eval_tf) if test_dir.is_dir() else self.val_set
        else:
            samples = self._scan(self.root)
            labels = [label for _, label in samples]
            fractions = [self.val_fraction] + ([self.test_fraction] if self.test_fraction > 0 else [])
            parts = stratified_split(labels, fractions, self.seed)
            pick = lambda idx: [samples[i] for i in idx]
            self.train_set = ImageFiles(pick(parts[0]), train_tf)
            self.val_set = ImageFiles(pick(parts[1]), eval_tf)
            self.test_set = ImageFiles(pick(parts[2]), eval_tf) if len(parts) > 2 else self.val_set
        log.info("%s: %d train, %d val, %d test images, %d classes", self.root, len(self.train_set),
                 len(self.val_set), len(self.test_set), self.num_classes)


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
        root_path = Path(root)
        for split in ("train", "val"):
            if not (root_path / split).is_dir():
                raise FileNotFoundError(
                    f"ImageNet folder {root_path / split} not found; "
                    f"expected {root_path}/train/<class>/*.JPEG "
                    f"and {root_path}/val/<class>/*.JPEG (the layout of timm and torchvision's ImageFolder)"
                )
        super().__init__(root, skip_bad_images=skip_bad_images, batch_size=batch_size, num_workers=num_workers,
                         color_jitter=color_jitter, **kwargs)
