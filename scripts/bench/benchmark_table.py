"""How long `vit` takes to read a labels table and split it, against reading the same images as class folders.

A tree of empty .JPEG files in class folders (ImageNet's shape at ``--files 1281167 --classes 1000``) and a CSV
that lists it in shuffled order (``path,label``, paths relative to the table). Timed, alternating, median of
``--runs``: `ImageFolder` scanning the folders and splitting them, and `LabelsFile` reading the table (every path
checked to exist, by one listing per folder), sorting and splitting it: the same samples come out (checked). The
header check that opens every file is the same for both and left out (`benchmark_files.py` times it). Memory: the
bytes still held per row once the splits exist (tracemalloc). ``--tags`` adds a multi-label table of the same rows
(1 to 3 of that many tags per row) split by iterative stratification.

    python scripts/bench/benchmark_table.py                                  # 100,000 files, 100 classes
    python scripts/bench/benchmark_table.py --files 1281167 --classes 1000 --tags 20 --json table.json
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import random
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vit.data.folder import ImageFolder
from vit.data.table import LabelsFile


def make_tree(root: Path, files: int, classes: int) -> list[tuple[str, str]]:
    """``classes`` folders holding ``files`` empty .JPEG files in all; returns (relative path, class) rows."""
    rows = []
    for c in range(classes):
        name = f"n{c:08d}"
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(files // classes):
            rows.append((f"{name}/{name}_{i}.JPEG", name))
            (root / rows[-1][0]).touch()
    return rows


def write_tables(root: Path, rows: list[tuple[str, str]], tags: int, seed: int = 0) -> None:
    """root/labels.csv (rows shuffled) and, with ``tags``, root/tags.csv: 1 to 3 tags per row, ";"-joined."""
    rows = rows[:]
    random.Random(seed).shuffle(rows)
    with (root / "labels.csv").open("w", newline="") as f:
        csv.writer(f).writerows([("path", "label"), *rows])
    if tags:
        rng = np.random.default_rng(seed)
        weights = 1.0 / np.arange(1, tags + 1)  # a long tail: tag k about 1/k as common as the first
        with (root / "tags.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(("path", "tags"))
            for path, _ in rows:
                chosen = rng.choice(tags, size=rng.integers(1, 4), replace=False, p=weights / weights.sum())
                writer.writerow((path, ";".join(f"t{k}" for k in sorted(chosen))))


def timed(build: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    start = time.perf_counter()
    out = build()
    return time.perf_counter() - start, out


def held_per_row(build: Callable[[], Any], rows: int) -> float:
    """Bytes per row still allocated once ``build`` returned (what it returns is kept alive)."""
    gc.collect()
    tracemalloc.start()
    kept = build()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return held / rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--tags", type=int, default=0, help="also a multi-label table of this many tags")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--root", help="where the tree goes (kept); default: a temporary folder, removed after")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.root or tmp)
        start = time.perf_counter()
        rows = make_tree(root, args.files, args.classes)
        write_tables(root, rows, args.tags)
        print(f"{len(rows):,} files in {args.classes} classes, and their table, written in "
              f"{time.perf_counter() - start:.0f} s")
        folder = lambda: ImageFolder(str(root), check_images=False).splits()
        table = lambda: LabelsFile(str(root), table="labels.csv", check_images=False).splits()
        times: dict[str, list[float]] = {"folder": [], "table": []}
        for _ in range(args.runs):
            t, by_folder = timed(folder)
            times["folder"].append(t)
            t, by_table = timed(table)
            times["table"].append(t)
        assert by_table == by_folder, "the table's splits differ from the folder's"
        result: dict[str, Any] = {
            "rows": len(rows), "classes": args.classes,
            "folder_s": statistics.median(times["folder"]), "table_s": statistics.median(times["table"]),
            "folder_bytes_per_row": held_per_row(folder, len(rows)),
            "table_bytes_per_row": held_per_row(lambda: (d := LabelsFile(str(root), table="labels.csv",
                                                                         check_images=False), d.splits()), len(rows)),
        }
        print(f"scan + split: class folders {result['folder_s']:.2f} s, labels table {result['table_s']:.2f} s "
              f"(median of {args.runs}); held per row: {result['folder_bytes_per_row']:.0f} B and "
              f"{result['table_bytes_per_row']:.0f} B")
        if args.tags:
            multi = lambda: LabelsFile(str(root), table="tags.csv", check_images=False).splits()
            result["multi_label_s"] = statistics.median(timed(multi)[0] for _ in range(args.runs))
            print(f"multi-label table, {args.tags} tags, iterative stratification: {result['multi_label_s']:.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
