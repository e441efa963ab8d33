"""What a dataset holds (`vit.audit.inventory`), on hand-made image records: counts, the small-class boundary,
leakage counted once per held-out image (exact over near), label conflicts of exact copies only."""

from __future__ import annotations

from vit.audit.inventory import SMALL_CLASS, describe_pairs, inventory, label_conflicts, leakage
from vit.audit.scan import ImageRecord

CLASSES = ["a", "b", "c"]


def record(split: str, i: int, label: int, problem: str | None = None) -> ImageRecord:
    return ImageRecord(split, i, f"{split}/{i}.png", label, 8, 4, "RGB", "PNG", problem=problem)


def test_counts_per_split_and_class_and_the_small_class_boundary():
    # train: a 100, b 10 (exactly SMALL_CLASS of the largest: not small), c 9 (just under: small)
    records = ([record("train", i, 0) for i in range(100)] + [record("train", 100 + i, 1) for i in range(10)]
               + [record("train", 110 + i, 2) for i in range(9)] + [record("val", 0, 1, problem="truncated")])
    assert SMALL_CLASS == 0.1
    inv = inventory(records, CLASSES)
    assert inv["images"] == 120 and inv["images_per_split"] == {"train": 119, "val": 1}
    assert inv["images_per_class"] == {"train": [100, 10, 9], "val": [0, 1, 0]}
    assert inv["small_classes"] == [{"class": "c", "images": 9, "largest": 100}]
    assert inv["sizes"] == [{"width": 8, "height": 4, "images": 119}] and inv["aspect_ratios"][0] == 2.0
    assert inv["bad_files"] == [{"path": "val/0.png", "split": "val", "problem": "truncated"}]


def test_leakage_counts_each_held_out_image_once_and_exact_over_near():
    records = [record("train", 0, 0), record("train", 1, 0), record("test", 0, 0), record("test", 1, 1),
               record("val", 0, 2)]
    pairs = [(2, 0, "near", 5, 0.9, 0.8), (0, 2, "exact", 0, 1.0, 0.8),  # test/0: near and exact copy: exact
             (1, 2, "near", 6, 0.85, 0.8),  # and a near copy of the same image: still one image
             (3, 1, "exact", 0, 1.0, 0.8),  # test/1, labelled b, is an exact copy of a train image labelled a
             (0, 1, "exact", 0, 1.0, 0.8),  # within train: no leakage, and the same label
             (4, 3, "near", 7, 0.8, 0.8)]  # val/0 and test/1: val comes first
    rows = describe_pairs(records, pairs, CLASSES)
    assert all(r["split_a"] in ("train", "val") for r in rows if r["split_a"] != r["split_b"])
    assert rows[-1]["split_a"] == rows[-1]["split_b"] == "train"  # within a split: last
    assert leakage(rows) == {"test": {"train": {"exact": 2, "near": 0}, "val": {"exact": 0, "near": 1}}}
    (conflict,) = label_conflicts(rows)
    assert (conflict["path_a"], conflict["label_a"], conflict["path_b"], conflict["label_b"]) == (
        "train/1.png", "a", "test/1.png", "b")
