"""img_size "auto": the images' typical side, rounded to a multiple of 8 within 32-64 (vit/data/sizing.py), as the
folder and labels-file DataModules resolve it."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vit.data import Digits, ImageFolder, LabelsFile
from vit.data.sizing import auto_augmentation, auto_img_size, short_sides
from vit.errors import UserValueError


@pytest.mark.parametrize(("side", "expected"), [
    (8, 32), (28, 32), (32, 32), (35, 32), (36, 40),  # the low bound, and a half rounding up (36 = 4.5 x 8)
    (44, 48), (56, 56), (60, 64), (64, 64), (84, 64), (500, 64),  # the high bound
])
def test_auto_side_is_the_nearest_multiple_of_8_within_32_64(side, expected):
    assert auto_img_size([side]) == expected


def test_auto_side_follows_the_median_not_the_mean():
    sides = [20, 24, 56, 60, 480]  # mean 128 (-> 64); median 56, as numpy says
    assert np.median(sides) == 56 and auto_img_size(sides) == 56
    assert auto_img_size([]) == 32  # nothing readable: the tuned side


def test_short_sides_reads_headers_skips_unreadable_files_and_stops_at_the_limit(tmp_path):
    paths = []
    for i, size in enumerate([(40, 30), (10, 90), (64, 64)]):
        paths.append(tmp_path / f"{i}.png")
        Image.new("L", size).save(paths[-1])
    (tmp_path / "bad.png").write_bytes(b"not a png")
    assert short_sides([paths[0], tmp_path / "bad.png", *paths[1:]]) == [30, 10, 64]
    assert short_sides(paths, limit=2) == [30, 10]


def write_folder(root: Path, side: int) -> Path:
    for split in ("train", "val"):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (side, side)).save(root / split / label / f"{i}.png")
    return root


@pytest.mark.parametrize(("side", "expected"), [(20, 32), (56, 56), (100, 64)])
def test_a_folder_with_auto_trains_at_its_images_side(tmp_path, side, expected):
    data = ImageFolder(root=str(write_folder(tmp_path, side)), img_size="auto")
    assert data.img_size == expected
    data.setup("fit")
    image, _ = data.train_set[0]
    assert tuple(image.shape[-2:]) == (expected, expected)  # the transforms use it too


def test_a_number_stays_a_number(tmp_path):
    assert ImageFolder(root=str(write_folder(tmp_path, 56)), img_size=40).img_size == 40


def test_a_labels_file_with_auto_reads_its_listed_images(tmp_path):
    rows = [("file_name", "labels", "split")]
    for i in range(6):
        Image.new("RGB", (48, 48)).save(tmp_path / f"{i}.png")
        rows.append((f"{i}.png", "x;y" if i % 2 else "x", "train" if i < 4 else "val"))
    with (tmp_path / "metadata.csv").open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    assert LabelsFile(root=str(tmp_path), img_size="auto").img_size == 48


def test_auto_on_a_datamodule_without_files_is_refused_by_name():
    with pytest.raises(UserValueError, match="Digits does not"):
        Digits(img_size="auto")


RANDAUGMENT = "rand-m9-mstd0.5-inc1"


@pytest.mark.parametrize(("side", "img_size", "small"), [
    (40, 96, True), (48, 96, True),  # drawn at 2.4x and at exactly 2x: small images
    (49, 96, False), (64, 96, False), (224, 224, False),  # under 2x: the policy
])
def test_auto_augmentation_drops_randaugment_for_images_drawn_at_twice_their_side(side, img_size, small):
    expected = ({"auto_augment": None, "re_prob": 0.0, "scale": (0.7, 1.0)} if small else {"auto_augment": RANDAUGMENT})
    assert auto_augmentation([side], img_size) == expected
    assert auto_augmentation([], img_size) == {"auto_augment": RANDAUGMENT}  # nothing readable: the policy


@pytest.mark.parametrize(("side", "small"), [(40, True), (64, False)])
def test_a_folder_with_auto_augment_builds_its_transforms_from_the_rule(tmp_path, side, small):
    data = ImageFolder(root=str(write_folder(tmp_path, side)), img_size=96, auto_augment="auto", re_prob=0.25)
    data.setup("fit")
    ops = [type(t).__name__ for t in (data.train_set.transform.ops.transforms if data.train_set.transform.ops
                                      else [])]
    crop = data.train_set.transform.crop
    assert data.auto_augment == (None if small else RANDAUGMENT)
    assert ("RandAugment" in ops) != small
    assert tuple(crop.scale) == ((0.7, 1.0) if small else (0.08, 1.0))
    assert data.batch_transform.re_prob == (0.0 if small else 0.25)  # the device's erasing follows the rule too
