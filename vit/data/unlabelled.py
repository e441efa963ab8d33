"""A folder of images without labels, for self-supervised pre-training (`vit pretrain`).

It is `ImageFolder` with the class folders read as nothing but folders: every image under ``root`` counts,
at any depth, flat or in sub-folders, and each gets the label 0. So the image settings, the header checks at
setup, ``skip_bad_images`` and the DDP sharding are ImageFolder's own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from vit.data.folder import ImageFolder
from vit.data.io import find_images, require_folder

log = logging.getLogger(__name__)


class UnlabelledFolder(ImageFolder):
    """Every image under ``root`` (class sub-folders allowed and ignored, a flat folder works too), with
    ``val_fraction`` of them held out to follow the validation loss and draw the reconstruction figure; or
    ``root/train/`` and ``root/val/`` when both exist (ImageNet's layout: its labels go unused).

    The defaults are MAE's augmentation: a random resized crop of 20-100% of the image and a horizontal
    flip, nothing else (no RandAugment, colour jitter or random erasing). Images of any common mode become
    RGB; bad files are reported at setup, or left out and replaced with ``skip_bad_images``, as in ImageFolder.

    Args:
        root: the folder of images.
        val_fraction: share of the images held out for validation (single-folder layout only).
        skip_bad_images: leave out files whose header is bad, and replace images that fail to decode.
        max_bad_fraction: with skip_bad_images, stop when more than this share fails to decode in one epoch.
        check_images: check every file's header at setup (cheap: no decoding).
        batch_size: images per batch (per device).
    """

    def __init__(
        self,
        root: str,
        val_fraction: float = 0.05,
        skip_bad_images: bool = False,
        max_bad_fraction: float = 0.01,
        check_images: bool = True,
        *,
        batch_size: int = 64,
        auto_augment: str | None = None,
        re_prob: float = 0.0,
        color_jitter: float = 0.0,
        scale: tuple[float, float] = (0.2, 1.0),
        **kwargs: Any,
    ) -> None:
        super().__init__(root, val_fraction=val_fraction, test_fraction=0.0, skip_bad_images=skip_bad_images,
                         max_bad_fraction=max_bad_fraction, check_images=check_images, batch_size=batch_size,
                         auto_augment=auto_augment, re_prob=re_prob, color_jitter=color_jitter, scale=scale, **kwargs)

    def _read_layout(self) -> list[str]:
        require_folder(self.root)
        self._split_folders = self.split_folder("train") is not None and self.split_folder("val") is not None
        return ["image"]  # one label for all: pre-training reads none

    def _scan(self, folder: Path, allow_empty: bool = False) -> list[tuple[str, int]]:
        found = find_images([folder])  # recursive; no images at all is an error naming the folder, in any split
        for line in found.describe_skipped():
            log.warning(line)
        return [(str(path), 0) for path in found.files]

    def _report_class_counts(self) -> None:
        """Nothing to report: there are no classes."""
