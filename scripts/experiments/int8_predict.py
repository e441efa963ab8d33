"""The issue's tolerance, measured as it defines it: top-1 agreement of each backend with eager fp32 through `vit
predict` on real images (the first 300 of the digits' test split, written as the 8x8 PNGs scikit-learn holds), for a
digits-trained checkpoint (docs/speed.md, "int8 within tolerance?").

    flock /tmp/vit-heavy.lock python scripts/experiments/int8_predict.py --ckpt CKPT --config CONFIG --work DIR

It runs `vit export --format onnx --int8 static --calibration CONFIG` once (300 training images, as documented),
then `vit predict --top_k 10` (every class's probability) with each backend, and compares each CSV with
`--backend torch`'s: same top-1, the largest difference of any class's probability, and eager's top-1 probability
lead where an answer changed. The wall time of each command is printed beside it.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import time
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

BACKENDS = {"torch": "ckpt", "torch-bf16": "ckpt", "openvino-bf16": "ckpt", "openvino-int8": "int8",
            "onnx-int8": "int8"}


def write_test_images(folder: Path, count: int) -> None:
    """The first ``count`` images of the Digits DataModule's test split (seed 0), as 8x8 grey PNGs."""
    from vit.data import Digits

    data = Digits(img_size=8)
    data.setup("test")
    digits = load_digits()
    folder.mkdir(parents=True, exist_ok=True)
    for k, i in enumerate(data.test_set.indices[:count]):
        pixels = (digits.images[i] * 255 / 16).astype(np.uint8)
        Image.fromarray(pixels, "L").save(folder / f"{k:04d}_{digits.target[i]}.png")


def probabilities(path: Path) -> dict[str, dict[str, float]]:
    rows = {}
    with open(path) as f:
        table = list(csv.DictReader(f))
    for row in table:
        k = 1
        rows[Path(row["path"]).name] = probs = {}
        while row.get(f"class_{k}"):
            probs[row[f"class_{k}"]] = float(row[f"prob_{k}"])
            k += 1
    return rows


def compare(reference: dict, got: dict) -> dict:
    same, diff, flips = 0, 0.0, []
    for name, ref in reference.items():
        mine = got[name]
        top = max(ref, key=ref.get)
        if max(mine, key=mine.get) == top:
            same += 1
        else:
            second = sorted(ref.values())[-2]
            flips.append(round(ref[top] - second, 4))
        diff = max(diff, max(abs(ref[c] - mine.get(c, 0.0)) for c in ref))
    return {"agreement": same / len(reference), "same": same, "images": len(reference), "max_prob_diff": diff,
            "flipped_prob_leads": sorted(flips)}


def run(command: list[str], log: Path) -> float:
    start = time.perf_counter()
    with open(log, "w") as f:
        subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--work", required=True, help="a folder for the images, the export and the CSVs")
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    args = parser.parse_args()
    work = Path(args.work)
    if not (work / "img").is_dir():
        write_test_images(work / "img", args.images)
    int8 = work / "export" / "model.int8.onnx"
    if not int8.exists():
        seconds = run(["vit", "export", "--ckpt", args.ckpt, "--format", "onnx", "--int8", "static", "--calibration",
                       args.config, "--out", str(work / "export")], work / "export.log")
        print(f"vit export --int8 static: {seconds:.1f} s", flush=True)
    results = {}
    for backend in args.backends:
        model = args.ckpt if BACKENDS[backend] == "ckpt" else str(int8)
        out = work / f"pred-{backend}.csv"
        seconds = run(["vit", "predict", "--ckpt", model, "--backend", backend, "--top_k", "10", "--accept_all",
                       str(work / "img"), "--out", str(out)], work / f"pred-{backend}.log")
        results[backend] = probabilities(out)
        line = f"{backend}: vit predict {seconds:.1f} s"
        if backend != "torch":
            c = compare(results["torch"], results[backend])
            line += (f", top-1 agreement {c['same']}/{c['images']} = {c['agreement']:.4f}, max prob diff "
                     f"{c['max_prob_diff']:.4f}, eager's prob lead where changed: {c['flipped_prob_leads']}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
