"""`vit.active.pool`: near-duplicates found by `vit audit`'s search (one of each group kept), and the labels file's
paths (relative under its folder, absolute elsewhere)."""

from __future__ import annotations

import csv

import numpy as np
from PIL import Image

from vit.active.choose import Pick
from vit.active.pool import duplicate_followers, write_labels_file


def test_a_copy_and_a_reencoded_resized_copy_follow_their_original_and_distinct_images_do_not(tmp_path):
    rng = np.random.default_rng(0)
    files = []
    for i in range(4):  # smooth, distinct random images
        small = rng.integers(0, 255, (6, 6, 3), dtype=np.uint8)
        Image.fromarray(small).resize((48, 48), Image.Resampling.BICUBIC).save(path := tmp_path / f"{i}.png")
        files.append(path)
    Image.open(files[1]).save(copy := tmp_path / "1_copy.png")  # the same pixels
    Image.open(files[2]).resize((44, 44)).save(near := tmp_path / "2_small.jpg", quality=85)  # resized, JPEG
    followers = duplicate_followers([*files, copy, near])
    assert followers.tolist() == [False, False, False, False, True, True]


def test_the_labels_file_names_images_under_its_folder_relatively_and_others_absolutely(tmp_path):
    inside, outside = tmp_path / "out" / "pool" / "a.png", tmp_path / "elsewhere" / "b.png"
    out = write_labels_file(tmp_path / "out" / "to_label.csv", [inside, outside], [Pick(1, "r1"), Pick(0, "r0")])
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    assert rows == [["file_name", "label", "reason"], [str(outside), "", "r1"], ["pool/a.png", "", "r0"]]
