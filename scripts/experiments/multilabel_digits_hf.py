"""The multi-label digit composites as Hugging Face data: the labels-file path's mAP, reproduced from `save_to_disk`.

    python scripts/experiments/multilabel_digits_hf.py --seeds 0 1 2 --epochs 40 --json multilabel_hf.json

The composites of `multilabel_digits.py` (same seed, same images), written twice: the folder with its
``metadata.csv`` (``file_name,labels,split``, "1;3;7"), and a `datasets.DatasetDict` (train / validation / test) of
an Image column and a ``Sequence(ClassLabel)`` column, saved with ``save_to_disk``, the rows in the table's order.
Both are trained with the same recipe (`configs/multilabel_cpu.yaml`, which names LabelsFile: `vit fit` reads the
Arrow folder with HFDataset by itself), each seed in its own process, and their test macro mAP compared.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multilabel_digits import recipe_arm, write_composites


def write_arrow(folder: Path, out: Path) -> Path:
    """The composites of ``folder`` as a DatasetDict with Sequence(ClassLabel) labels, saved to ``out``."""
    import datasets

    rows = list(csv.DictReader((folder / "metadata.csv").open()))
    features = datasets.Features({"image": datasets.Image(),
                                  "labels": datasets.Sequence(datasets.ClassLabel(names=[str(d) for d in range(10)]))})
    parts = {}
    for split, name in (("train", "train"), ("val", "validation"), ("test", "test")):
        mine = sorted((r for r in rows if r["split"] == split), key=lambda r: r["file_name"])
        parts[name] = datasets.Dataset.from_dict(
            {"image": [{"bytes": (folder / r["file_name"]).read_bytes(), "path": None} for r in mine],
             "labels": [[int(d) for d in r["labels"].split(";")] for r in mine]}, features=features)
    datasets.DatasetDict(parts).save_to_disk(str(out))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--folder", type=Path, default=None, help="where the data goes (default: a temp folder)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    root = args.folder or Path(tempfile.mkdtemp(prefix="multilabel_hf_"))
    if not (root / "table" / "metadata.csv").is_file():
        write_composites(root / "table")
    if not (root / "arrow" / "dataset_dict.json").is_file():
        write_arrow(root / "table", root / "arrow")
    results: dict[str, list[float]] = {"labels file": [], "save_to_disk": []}
    for seed in args.seeds:
        for arm, data in (("labels file", root / "table"), ("save_to_disk", root / "arrow")):
            results[arm].append(recipe_arm(data, seed, args.epochs)["map"])
            print(arm, seed, round(results[arm][-1], 4), flush=True)
    diffs = np.abs(np.subtract(results["save_to_disk"], results["labels file"]))
    print("| data | test macro mAP per seed | mean |")
    print("|---|---|---|")
    for arm, maps in results.items():
        print(f"| {arm} | {' / '.join(f'{m:.4f}' for m in maps)} | {np.mean(maps):.4f} |")
    print(f"largest difference over seeds: {diffs.max():.4f}")
    if args.json:
        args.json.write_text(json.dumps({"epochs": args.epochs, **results}, indent=2))
    return results


if __name__ == "__main__":
    main()
