"""What a dataset holds: images per class and split, sizes, aspect ratios, modes, formats, bad files;
and which duplicate pairs cross splits (leakage) or classes (label conflicts)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from vit.audit.scan import ImageRecord

SPLITS = ("train", "val", "test")
SMALL_CLASS = 0.1  # a class under this share of the largest class's training images is flagged


def inventory(records: Sequence[ImageRecord], class_names: Sequence[str]) -> dict[str, Any]:
    """Counts per split and class, the small classes, and tables of sizes, modes, formats and bad files."""
    splits = [s for s in SPLITS if any(r.split == s for r in records)]
    counts = {s: [0] * len(class_names) for s in splits}
    for r in records:
        counts[r.split][r.label] += 1
    base = counts.get("train") or [sum(c) for c in zip(*counts.values())]
    largest = max(base, default=0)
    small = [{"class": class_names[c], "images": n, "largest": largest}
             for c, n in enumerate(base) if n < SMALL_CLASS * largest]
    good = [r for r in records if r.problem is None]
    return {
        "images": len(records),
        "images_per_split": {s: sum(counts[s]) for s in splits},
        "classes": list(class_names),
        "images_per_class": counts,
        "small_classes": small,
        "sizes": [{"width": w, "height": h, "images": n}
                  for (w, h), n in Counter((r.width, r.height) for r in good).most_common()],
        "aspect_ratios": [round(r.width / r.height, 3) for r in good if r.height],
        "modes": dict(Counter(r.mode for r in good).most_common()),
        "formats": dict(Counter(r.format for r in good).most_common()),
        "bad_files": [{"path": r.name, "split": r.split, "problem": r.problem} for r in records if r.problem],
    }


def describe_pairs(records: Sequence[ImageRecord], pairs: Sequence[tuple[int, int, str, int, float, float]],
                   class_names: Sequence[str]) -> list[dict[str, Any]]:
    """One row per duplicate pair, the earlier split first (train, val, test); cross-split pairs first,
    then exact before near, then by verification score (highest first)."""
    order = {s: i for i, s in enumerate(SPLITS)}
    rows = []
    for i, j, kind, distance, score, needed in pairs:
        a, b = sorted((records[i], records[j]), key=lambda r: (order.get(r.split, 9), r.name))
        rows.append({"path_a": a.name, "split_a": a.split, "path_b": b.name, "split_b": b.split, "kind": kind,
                     "distance": distance, "score": score, "needed": needed,
                     "label_a": class_names[a.label],
                     "label_b": class_names[b.label], "_a": a, "_b": b})
    rows.sort(key=lambda r: (r["split_a"] == r["split_b"], r["kind"] != "exact", -r["score"], r["path_a"]))
    return rows


def leakage(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, int]]]:
    """Per held-out split, how many of its images have an exact copy, or only a near copy, in an earlier split,
    e.g. ``{"test": {"train": {"exact": 3, "near": 24}}}``: 27 test images have a copy in train, 3 of them exact."""
    leaked: dict[str, dict[str, dict[str, str]]] = {}
    for r in rows:
        if r["split_a"] != r["split_b"]:
            kinds = leaked.setdefault(r["split_b"], {}).setdefault(r["split_a"], {})
            if kinds.get(r["path_b"]) != "exact":
                kinds[r["path_b"]] = r["kind"]
    return {split: {other: {kind: sum(k == kind for k in kinds.values()) for kind in ("exact", "near")}
                    for other, kinds in found.items()} for split, found in leaked.items()}


def label_conflicts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The exact duplicates whose two copies carry different labels."""
    return [r for r in rows if r["kind"] == "exact" and r["label_a"] != r["label_b"]]
