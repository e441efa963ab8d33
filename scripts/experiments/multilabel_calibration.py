"""A temperature per class on a multi-label model, measured: per-class ECE before and after T on val and on test.

    python scripts/experiments/multilabel_calibration.py --seeds 0 1 2 --json calibration.json
    python scripts/experiments/multilabel_calibration.py --seeds 0 --epochs 20 \
        --figure docs/figures/reliability_multilabel.png

The digit composites of `multilabel_digits.py` (a reduced split by default, so a run takes minutes on 2 cores);
each seed runs `vit fit --config configs/multilabel_cpu.yaml --data.init_args.hflip 0 --calibrate true` in its own
process (the recipe fits a T per class on val at its end), then reads the best checkpoint and measures, on val and
on the held-out test composites: per-class ECE (15 bins, averaged over the classes), BCE and Brier before (T = 1)
and after the stored T, and whether every image's set of labels stayed the same (the moved thresholds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from multilabel_digits import write_composites

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "multilabel_cpu.yaml"


def fit(root: Path, work: Path, seed: int, epochs: int) -> tuple[Path, list[str]]:
    """`vit fit` with the recipe and --calibrate true, in its own process; its best checkpoint and what its
    calibration printed."""
    cmd = [sys.executable, "-m", "vit", "fit", "--config", str(RECIPE), f"--data.init_args.root={root}",
           "--data.init_args.hflip=0", f"--seed_everything={seed}", f"--trainer.max_epochs={epochs}",
           "--trainer.enable_progress_bar=false", "--test_after_fit=false", "--calibrate=true"]
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode or "calibrated " not in done.stdout:
        raise SystemExit(done.stdout[-2000:] + done.stderr[-3000:])
    lines = done.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("temperature per class"))
    last = next(i for i, line in enumerate(lines) if line.startswith("calibrated "))
    return next(work.rglob("best-*.ckpt")), lines[first:last + 1]


@torch.no_grad()
def measure(ckpt: Path, root: Path) -> dict[str, Any]:
    """Per split: the figures before and after the stored T, and whether every image kept its labels."""
    from vit.cli.data import config_split_images
    from vit.deploy.classifier import read_classifier
    from vit.deploy.label_calibration import label_figures, label_sets

    classifier = read_classifier(ckpt)
    calibration = classifier.calibration
    found: dict[str, Any] = {"temperature": calibration.temperature}
    for split in ("val", "test"):
        images, targets = config_split_images(RECIPE, split, classifier.eval_transform(), classifier.image_mode,
                                              root=str(root))
        logits = torch.cat([classifier(x) for x in images.split(256)])
        same = label_sets(logits, classifier.thresholds) == label_sets(logits, classifier.thresholds, calibration)
        found[split] = {"before": label_figures(logits, targets), "after":
                        label_figures(logits, targets, calibration.temperature), "labels_unchanged": same,
                        "images": len(targets)}
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--sizes", type=int, nargs=3, default=[1200, 300, 600], metavar=("TRAIN", "VAL", "TEST"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--figure", type=Path, default=None,
                        help="copy the first seed's reliability diagram (val, before and after T) here, e.g. "
                             "docs/figures/reliability_multilabel.png")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="multilabel_calibration_"))
    root = write_composites(work / "data", dict(zip(("train", "val", "test"), args.sizes)))
    results = []
    for seed in args.seeds:
        start = time.perf_counter()
        (work / f"seed{seed}").mkdir()
        best, printed = fit(root, work / f"seed{seed}", seed, args.epochs)
        results.append({"seed": seed, "printed": printed, **measure(best, root)})
        if args.figure and seed == args.seeds[0]:  # the diagram the recipe's calibration drew in the run folder
            args.figure.write_bytes(next((work / f"seed{seed}").rglob("reliability.png")).read_bytes())
        results[-1]["seconds"] = time.perf_counter() - start
        print("\n".join(printed))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "temperature"}), flush=True)
    print("| seed | val ECE before -> after | test ECE before -> after | test BCE before -> after | "
          "test Brier before -> after | labels unchanged (val, test) | T_c range |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        v, t = r["val"], r["test"]
        print(f"| {r['seed']} | {v['before']['ece']:.4f} -> {v['after']['ece']:.4f} | {t['before']['ece']:.4f} -> "
              f"{t['after']['ece']:.4f} | {t['before']['nll']:.4f} -> {t['after']['nll']:.4f} | "
              f"{t['before']['brier']:.4f} -> {t['after']['brier']:.4f} | {v['labels_unchanged']}, "
              f"{t['labels_unchanged']} | {min(r['temperature']):.2f}-{max(r['temperature']):.2f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
