"""How long `vit` takes to find and vet the files of a large image folder, against torchvision.

1. Scanning: 100,000 empty files in 100 class folders (ImageNet's shape, scaled down 13x), listed by
   `vit.data.io.scan_class_folders` and by torchvision's `make_dataset`, alternating, median of 5.
2. Header checks: 10,000 real small JPEGs (and a few bad files) checked by
   `vit.data.io.check_image_files` in-process and with every core.

    python scripts/bench/benchmark_files.py                 # trees under a temporary folder, removed after
    python scripts/bench/benchmark_files.py --root /data/bench --files 1281167 --classes 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image


def make_tree(root: Path, files: int, classes: int) -> None:
    """``classes`` folders holding ``files`` empty .JPEG files in all (made once)."""
    if root.is_dir():
        return
    for c in range(classes):
        folder = root / f"n{c:08d}"
        folder.mkdir(parents=True)
        for i in range(files // classes):
            (folder / f"n{c:08d}_{i}.JPEG").touch()


def make_jpegs(root: Path, count: int) -> None:
    """``count`` small real JPEGs (64x48 noise) in 10 classes, plus three bad files."""
    if root.is_dir():
        return
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"c{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / f"{i}.jpg", quality=85)
    (root / "c0" / "empty.jpg").touch()
    (root / "c1" / "text.jpg").write_text("not a jpeg")
    (root / "c2" / "cut.jpg").write_bytes((root / "c2" / "2.jpg").read_bytes()[:100])


def time_it(fn, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return seconds


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=None, help="where to build the trees (default: a temp folder)")
    parser.add_argument("--files", type=int, default=100_000, help="empty files to scan (default: %(default)s)")
    parser.add_argument("--classes", type=int, default=100, help="class folders (default: %(default)s)")
    parser.add_argument("--jpegs", type=int, default=10_000, help="real JPEGs to check (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each (default: %(default)s)")
    args = parser.parse_args(argv)

    from torchvision.datasets.folder import make_dataset

    from vit.data.io import check_image_files, class_folders, scan_class_folders

    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp)
        tree, jpegs = root / "scan", root / "jpegs"
        make_tree(tree, args.files, args.classes)
        make_jpegs(jpegs, args.jpegs)
        classes = class_folders(tree)
        index = {c: i for i, c in enumerate(classes)}
        ours, theirs = [], []
        for _ in range(args.repeats):  # alternating, so a busy machine slows both alike
            theirs += time_it(lambda: make_dataset(str(tree), index, extensions=(".jpeg",)), 1)
            ours += time_it(lambda: scan_class_folders(tree, classes), 1)
        scan = {"files": args.files, "ours_s": statistics.median(ours), "torchvision_s": statistics.median(theirs)}
        scan["ratio"] = scan["ours_s"] / scan["torchvision_s"]
        print(f"scan of {args.files} files in {args.classes} folders: vit {scan['ours_s']:.3f} s, torchvision "
              f"make_dataset {scan['torchvision_s']:.3f} s, ratio {scan['ratio']:.2f} (median of {args.repeats})")

        paths = [p for p, _ in scan_class_folders(jpegs, class_folders(jpegs))]
        cores = len(os.sched_getaffinity(0))
        check = {"files": len(paths), "cores": cores}
        for workers in (1, cores):
            seconds = statistics.median(time_it(lambda w=workers: check_image_files(paths, num_workers=w), 3))
            check[f"{workers}_workers_s"] = seconds
            print(f"header check of {len(paths)} JPEGs with {workers} worker(s): {seconds:.2f} s "
                  f"({len(paths) / seconds:,.0f} files/s)")
        bad = check_image_files(paths)
        print(f"found {len(bad)} bad files: " + ", ".join(f"{Path(p).name} ({why})" for p, why in bad))
        check["bad_found"] = len(bad)
    return {"scan": scan, "check": check}


if __name__ == "__main__":
    main()
