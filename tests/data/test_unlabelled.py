"""UnlabelledFolder: any folder of images for `vit pretrain`, with ImageFolder's image handling."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.data.test_folder import write_bad_files
from tests.formats import random_rgb, write_class_folders
from vit.data.unlabelled import UnlabelledFolder
from vit.errors import UserValueError


def folder(root, **kwargs) -> UnlabelledFolder:
    dm = UnlabelledFolder(str(root), batch_size=4, num_workers=0, img_size=16, **kwargs)
    dm.setup("fit")
    return dm


def test_a_flat_folder_and_class_folders_at_any_depth_all_count(tmp_path, caplog):
    root = tmp_path / "scans"
    write_class_folders(root, ["a", "b"], per_class=5, modes=["RGB", "L", "RGBA"])
    write_class_folders(root / "deeper" / "still", ["c"], per_class=5)
    for i in range(5):
        random_rgb(seed=100 + i).save(root / f"flat_{i}.png")
    (root / "notes.txt").write_text("not an image")
    with caplog.at_level(logging.WARNING, logger="vit.data.unlabelled"):
        dm = folder(root, val_fraction=0.2)
    assert "skipped 1 non-image file" in caplog.text
    assert len(dm.train_set) + len(dm.val_set) == 20 and len(dm.val_set) == 4
    files = {path for path, _ in dm.train_set.samples + dm.val_set.samples}
    assert len(files) == 20 and {label for _, label in dm.train_set.samples} == {0}
    x, _ = next(iter(dm.train_dataloader()))
    x = dm.on_after_batch_transfer([x, torch.zeros(4)], 0)[0]
    assert x.shape == (4, 3, 16, 16) and x.dtype == torch.float32 and torch.isfinite(x).all()
    only_flat = tmp_path / "flat"
    only_flat.mkdir()
    for i in range(6):
        random_rgb(seed=i).save(only_flat / f"{i}.jpg")
    assert len(folder(only_flat, val_fraction=0.2).train_set) == 5  # no sub-folder at all


def test_train_and_val_folders_are_used_as_they_are(tmp_path):
    write_class_folders(tmp_path / "train", ["x", "y"], per_class=6)
    write_class_folders(tmp_path / "val", ["x"], per_class=3)
    dm = folder(tmp_path)
    assert (len(dm.train_set), len(dm.val_set)) == (12, 3)


def test_the_default_augmentation_is_maes_crop_and_flip_only(tmp_path):
    dm = UnlabelledFolder(str(tmp_path), img_size=32)
    transform = dm.train_transform()
    assert transform.crop.scale == (0.2, 1.0) and transform.hflip == 0.5 and transform.ops is None
    assert dm.batch_transform.re_prob == 0  # no random erasing


def test_bad_files_are_listed_or_left_out_as_in_image_folder(tmp_path):
    write_bad_files(tmp_path)
    with pytest.raises(UserValueError, match=r"3 of 16 image files are unreadable") as error:
        folder(tmp_path)
    assert "notes.jpg" in str(error.value) and "skip_bad_images" in str(error.value)
    dm = folder(tmp_path, skip_bad_images=True)
    assert len(dm.train_set) + len(dm.val_set) == 13  # the truncated JPEG is replaced when it is decoded


def test_a_folder_without_images_says_so(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(UserValueError, match="no image files found"):
        folder(tmp_path / "empty")
