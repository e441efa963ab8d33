"""Loader throughput per core on Hugging Face data against the class-folder path, on the same images.

The same ``--images`` PNGs (default 60,000: sklearn's digits, 28x28, each with its own noise, so no two are alike)
written as class folders and as a `datasets` `save_to_disk` folder (an Image column and a ClassLabel) and as Hub-layout
Parquet. Timed on one thread (num_workers=0: what one loader worker does, no process start-up or IPC): the training
loader of `ImageFolder` (read the file, decode, augment, collate) against `HFDataset` on each (the row's bytes from
the Arrow buffers, then the same decode and augmentation), map-style and streaming, alternating, ``--batches`` batches
of ``--batch_size`` per run, median of ``--runs``. Setup (the scan, the table read, the header check) is timed apart.

    python scripts/bench/benchmark_hf.py                       # 60,000 images, 3 runs of 40 batches of 64
    python scripts/bench/benchmark_hf.py --images 10000 --runs 5 --json hf.json
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

OPTS = dict(img_size=28, batch_size=64, num_workers=0, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25,
            val_fraction=0.05, test_fraction=0.05)


def write_all(root: Path, images: int) -> dict[str, Path]:
    """The images as class folders, a save_to_disk folder and Parquet; returns the three roots."""
    import datasets
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(0)
    encoded, labels = [], []
    for k in range(images):
        i = k % len(digits.target)
        big = np.kron(digits.images[i] * 15, np.ones((3, 3)))  # 24x24
        pixels = np.clip(np.pad(big, 2) + rng.normal(0, 12, (28, 28)), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, "PNG")
        encoded.append(out.getvalue())
        labels.append(int(digits.target[i]))
    order = np.argsort(labels, kind="stable")  # the rows in the folder's sorted order
    for n, k in enumerate(order):
        path = root / "folder" / str(labels[k]) / f"{n:06d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encoded[k])
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(i) for i in
                                                                                                 range(10)])})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": encoded[k], "path": None} for k in order],
                                     "label": [labels[k] for k in order]}, features=features)
    ds.save_to_disk(str(root / "disk"))
    (root / "parquet" / "data").mkdir(parents=True)
    ds.to_parquet(str(root / "parquet" / "data" / "train-00000-of-00001.parquet"))
    return {"folder": root / "folder", "disk": root / "disk", "parquet": root / "parquet"}


def build(kind: str, root: Path) -> tuple[Any, float]:
    """The DataModule of ``kind`` set up, and its setup time."""
    from vit.data import HFDataset, ImageFolder

    start = time.perf_counter()
    if kind == "folder":
        data = ImageFolder(str(root), **OPTS)
    else:
        data = HFDataset(str(root), streaming=kind.endswith("stream"), **OPTS)
    data.setup("fit")
    return data, time.perf_counter() - start


def img_per_s(data: Any, batches: int) -> float:
    """Training images per second through the loader, one thread, ``batches`` batches after one warm-up."""
    loader = iter(data.train_dataloader())
    next(loader)
    start = time.perf_counter()
    n = 0
    for _ in range(batches):
        n += len(next(loader)[1])
    return n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=60_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--folder", type=Path, default=None, help="where the images go (default: a temp folder)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    root = args.folder or Path(tempfile.mkdtemp(prefix="bench_hf_"))
    start = time.perf_counter()
    roots = write_all(root, args.images) if not (root / "disk").is_dir() else \
        {"folder": root / "folder", "disk": root / "disk", "parquet": root / "parquet"}
    print(f"{args.images:,} images written three ways in {time.perf_counter() - start:.0f} s", flush=True)
    kinds = {"folder": roots["folder"], "save_to_disk": roots["disk"], "parquet": roots["parquet"],
             "save_to_disk stream": roots["disk"]}
    built = {kind: build(kind, path) for kind, path in kinds.items()}
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(args.runs):  # alternating, so a busy machine slows all alike
        for kind, (data, _) in built.items():
            rates[kind].append(img_per_s(data, args.batches))
    folder = statistics.median(rates["folder"])
    result = {"images": args.images, "setup_s": {k: round(s, 2) for k, (_, s) in built.items()},
              "img_s": {k: round(statistics.median(v), 1) for k, v in rates.items()},
              "vs_folder": {k: round(statistics.median(v) / folder, 3) for k, v in rates.items()}}
    print(f"{'loader (1 thread)':24s}{'setup s':>9s}{'img/s':>9s}{'vs folder':>11s}")
    for kind in kinds:
        print(f"{kind:24s}{result['setup_s'][kind]:9.1f}{result['img_s'][kind]:9.0f}{result['vs_folder'][kind]:11.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
