"""How hard is a small folder? scikit-learn's classic classifiers on its raw pixels, for scale beside the ViT tables.

    python scripts/classic_baselines.py ~/small/digits
    python scripts/classic_baselines.py ~/small/digits ~/small/tiles ~/small/mnist5k --json baselines.json

Reads a train/val/test folder of class folders (`scripts/small_folders.py` writes three) as grayscale pixels in
[0, 1] at the first training image's size; fits an RBF support-vector machine and k-nearest neighbours on train,
chooses each one's setting (C and gamma; k) by val accuracy, and prints their test top-1. No augmentation and no
learnt features: a floor that a ViT recipe should clear, and on a small test split a measure of what it allows
(docs/small-folders.md: no model measured on the digits' 359 test images reaches 0.990).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.neighbors import KNeighborsClassifier
from sklearn.svm import SVC

SPLITS = ("train", "val", "test")
SVM_C = (1.0, 10.0, 100.0)
SVM_GAMMA = (0.25, 0.5, 1.0, 2.0, 4.0)  # times scikit-learn's "scale": 1 / (features x pixel variance)
NEIGHBOURS = (1, 3, 5, 7)


def load_split(root: Path, split: str, classes: list[str], size: tuple[int, int] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """(pixels (N, H*W) float in [0, 1], labels (N,)) of root/split/<class>/*.png, grayscale, at ``size``."""
    pixels, labels = [], []
    for label, name in enumerate(classes):
        for path in sorted((root / split / name).glob("*.png")):
            with Image.open(path) as image:
                gray = image.convert("L")
                if size is not None and gray.size != size:
                    gray = gray.resize(size, Image.BILINEAR)
                pixels.append(np.asarray(gray, dtype=np.float64).ravel() / 255)
            labels.append(label)
    if not pixels:
        raise SystemExit(f"{root / split}: no PNG images in class folders {classes}")
    return np.stack(pixels), np.array(labels)


def load_folder(root: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each split of ``root`` at the size of its first training image."""
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    with Image.open(next((root / "train" / classes[0]).glob("*.png"))) as first:
        size = first.size
    return {split: load_split(root, split, classes, size) for split in SPLITS}


def choose(make, grid: list[dict], data: dict) -> dict:
    """The setting of ``grid`` with the best val accuracy (the first of ties), refitted on train: its test top-1."""
    (x_train, y_train), (x_val, y_val), (x_test, y_test) = (data[s] for s in SPLITS)
    scored = [(make(**params).fit(x_train, y_train).score(x_val, y_val), params) for params in grid]
    val, params = max(scored, key=lambda s: s[0])  # max keeps the first of equal scores
    test = make(**params).fit(x_train, y_train).score(x_test, y_test)
    return {"params": params, "val": float(val), "test": float(test)}


def baselines(root: Path) -> dict:
    data = load_folder(root)
    x_train = data["train"][0]
    scale = 1.0 / (x_train.shape[1] * x_train.var())
    svm_grid = [{"C": c, "gamma": g * scale} for c, g in itertools.product(SVM_C, SVM_GAMMA)]
    knn_grid = [{"n_neighbors": k} for k in NEIGHBOURS]
    return {"images": {s: len(data[s][1]) for s in SPLITS},
            "svm": choose(SVC, svm_grid, data), "knn": choose(KNeighborsClassifier, knn_grid, data)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="train/val/test folders of class folders of PNGs")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    results = {}
    for root in args.folders:
        result = results[root.name] = baselines(root)
        n = result["images"]
        print(f"{root.name} (train / val / test = {n['train']} / {n['val']} / {n['test']}):")
        svm, knn = result["svm"], result["knn"]
        print(f"  RBF SVM, C {svm['params']['C']:g}, gamma {svm['params']['gamma']:.4g}: val {svm['val']:.4f}, "
              f"test top-1 {svm['test']:.4f}")
        print(f"  {knn['params']['n_neighbors']}-nearest neighbours: val {knn['val']:.4f}, "
              f"test top-1 {knn['test']:.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
