"""From scratch on a small folder: `vit fit` side by side with a plain timm + torchvision loop, the
small-folder recipe and classic classifiers on the raw pixels, over a few seeds.

    python scripts/experiments/small_folders.py ~/small                 # three real folders, built offline
    python scripts/experiments/parity.py ~/small/digits ~/small/tiles ~/small/mnist5k --seeds 3 --json parity.json

A folder is ``train/ val/ test/`` of class folders (all arms read the very same files). The arms:

    loop     the reference: timm's VisionTransformer (dim 96, depth 4, 4 heads, drop path 0.1; 32 px in patches
             of 8, larger images at their own side: `parity_kinds.loop_arch`) in 25 plain lines of torchvision
             + PyTorch (`plain_loop`): Resize -> RandomResizedCrop (scale 0.7-1) -> flip (unless hflip is off)
             -> normalise at 0.5; AdamW lr 1e-3, wd 0.05 on every parameter; OneCycleLR (10% warm-up); label
             smoothing 0.1; batch 64; 30 epochs; final weights tested.
    parity   `vit fit` set up like the loop (`parity_config`): same model, data, optimiser, OneCycle schedule
             (`schedule: onecycle`) and epochs; final weights tested. What still differs is vit's own: no weight
             decay on biases, norms and embeddings (as timm's train.py), and a last batch under half a batch dropped.
    recipe   `vit fit --config configs/scratch_small.yaml --data.init_args.root FOLDER`, as a user runs it,
             plus the knobs its config documents (--recipe_args), e.g. no flips for digits.
    logreg   scikit-learn's logistic regression on standardised raw pixels at the images' own size
             (C chosen on val).
    svm      an RBF support-vector machine on the raw pixels (C and gamma chosen on val).
    knn      k-nearest neighbours on the raw pixels (k chosen on val).

The three pixel arms have no seed, no augmentation and no learnt features: a floor that the ViT arms should
clear, and on a small test split a measure of what it allows (the digits: docs/small-folders.md).

Each training arm runs as its own process (imports included in its wall time) with the same CPU threads
and loader workers. The table gives test top-1 per seed, the mean, the spread (max - min) and the mean
wall time. Seed-to-seed spread is several points on folders this small: compare means over 3+ seeds.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from parity_kinds import loop_arch, native_side

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "scratch_small.yaml"
ARMS = ("loop", "parity", "recipe", "logreg", "svm", "knn")
PIXEL_ARMS = ("logreg", "svm", "knn")
LOGREG_C = (0.001, 0.01, 0.1, 1.0)
SVM_C = (1.0, 10.0, 100.0)
SVM_GAMMA = (0.25, 0.5, 1.0, 2.0, 4.0)  # times scikit-learn's "scale": 1 / (features x pixel variance)
NEIGHBOURS = (1, 3, 5, 7)
LR, WEIGHT_DECAY, WARMUP, SMOOTHING, BATCH, EPOCHS, SCALE = 1e-3, 0.05, 0.1, 0.1, 64, 30, (0.7, 1.0)


def plain_loop(folder: Path, seed: int, epochs: int, workers: int, hflip: bool = True) -> dict[str, Any]:
    """The reference: the loop anyone would write with timm and torchvision. Returns test top-1 and steps."""
    import torch
    import torchvision.transforms as T
    from timm.models.vision_transformer import VisionTransformer
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    torch.manual_seed(seed)
    normalize = T.Normalize([0.5] * 3, [0.5] * 3)
    arch = loop_arch(native_side(folder))
    size = arch["img_size"]
    train_tf = T.Compose([T.Resize((size, size)), T.RandomResizedCrop(size, scale=SCALE),
                          *([T.RandomHorizontalFlip()] if hflip else []), T.ToTensor(), normalize])
    test_tf = T.Compose([T.Resize((size, size)), T.ToTensor(), normalize])
    train_set = ImageFolder(folder / "train", train_tf)
    train = DataLoader(train_set, batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    test = DataLoader(ImageFolder(folder / "test", test_tf), batch_size=256, num_workers=workers)
    model = VisionTransformer(num_classes=len(train_set.classes), **arch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, LR, total_steps=epochs * len(train), pct_start=WARMUP)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=SMOOTHING)
    for _ in range(epochs):
        model.train()
        for x, y in train:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in test)
    return {"acc": correct / len(test.dataset), "steps": epochs * len(train), "final_loss": loss.item()}


def parity_config(folder: Path, seed: int, epochs: int, workers: int, threads: int) -> dict[str, Any]:
    """A `vit fit` config with the loop's model, data, optimiser, schedule and epochs; final weights tested."""
    arch = loop_arch(native_side(folder))
    model_kwargs = {k: v for k, v in arch.items() if k != "img_size"}  # img_size comes from the data
    return {
        "seed_everything": seed, "test_after_fit": True, "num_threads": threads,
        "trainer": {"accelerator": "cpu", "devices": 1, "precision": "32-true", "max_epochs": epochs,
                    "logger": False, "enable_progress_bar": False},
        "checkpoint": {"dirpath": "checkpoints", "monitor": None},  # no monitor: the last epoch is tested
        "model": {"class_path": "vit.tasks.ImageClassifier", "init_args": {
            "model": "vit_tiny_patch16_224", "model_kwargs": model_kwargs, "head": {"init_args": {
                "label_smoothing": SMOOTHING}}, "optim": {"lr": LR, "weight_decay": WEIGHT_DECAY,
                                                           "warmup_epochs": WARMUP * epochs, "schedule": "onecycle"}}},
        "data": {"class_path": "vit.data.ImageFolder", "init_args": {
            "root": str(folder), "img_size": arch["img_size"], "batch_size": BATCH, "num_workers": workers,
            "mean": [0.5] * 3, "std": [0.5] * 3, "auto_augment": None, "re_prob": 0.0, "color_jitter": 0.0,
            "hflip": 0.5, "scale": list(SCALE), "crop_pct": 1.0, "interpolation": "bilinear"}},
    }


def run_vit_fit(args: list[str], workdir: Path, metric: str = "test_acc") -> dict[str, Any]:
    """`vit fit ARGS` in its own process and folder: the test ``metric`` (from its report) and steps trained."""
    done = subprocess.run([sys.executable, "-m", "vit", "fit", *args], cwd=workdir, capture_output=True, text=True)
    # The report's line names the monitored metric ("test accuracy of", "test loss of" with checkpoint.monitor
    # val_loss); the test table always has test_acc.
    match = re.search(rf"^\W*{metric}\W+([0-9.]+)", done.stdout, re.MULTILINE)
    if done.returncode or not match:
        raise RuntimeError(f"vit fit {' '.join(args)} failed (exit {done.returncode}):\n{done.stdout[-3000:]}"
                           f"\n{done.stderr[-3000:]}")
    import torch

    checkpoints = sorted(workdir.rglob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    steps = torch.load(checkpoints[-1], map_location="cpu", weights_only=False)["global_step"]
    return {"acc": float(match.group(1)), "steps": steps}


def run_arm(arm: str, folder: Path, seed: int, epochs: int, workers: int, threads: int,
            recipe_args: Sequence[str] = ()) -> dict[str, Any]:
    """One arm on one seed, in a fresh process and temporary folder; adds its wall time."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"parity-{arm}-") as tmp:
        work = Path(tmp)
        if arm == "loop":
            done = subprocess.run([sys.executable, __file__, str(folder), "--_loop", str(seed), "--epochs", str(epochs),
                                   "--workers", str(workers), "--threads", str(threads)],
                                  capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"the plain loop failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
        elif arm == "parity":
            (work / "parity.yaml").write_text(yaml.safe_dump(parity_config(folder, seed, epochs, workers, threads)))
            result = run_vit_fit(["--config", "parity.yaml"], work)
        else:
            args = ["--config", str(RECIPE), "--data.init_args.root", str(folder), "--seed_everything", str(seed),
                    "--trainer.enable_progress_bar", "false", "--data.init_args.num_workers", str(workers),
                    "--num_threads", str(threads)]
            if epochs != EPOCHS:  # a reduced run (the test suite's): the same number of epochs
                args += ["--trainer.max_epochs", str(epochs)]
            result = run_vit_fit([*args, *recipe_args], work)
    return {**result, "seconds": time.perf_counter() - start}


def gray_or_rgb(image: Any) -> Any:
    return image.convert("L" if image.mode in ("1", "L", "I;16") else "RGB")


def read_pixels(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every image of a split folder as a flat float vector (its own size, or 32x32 when sizes differ)."""
    from PIL import Image
    from torchvision.datasets import ImageFolder

    samples = ImageFolder(folder).samples
    images = [gray_or_rgb(Image.open(path)) for path, _ in samples]
    if len({(im.size, im.mode) for im in images}) > 1:
        images = [im.convert("RGB").resize((32, 32), Image.BILINEAR) for im in images]
    return np.stack([np.asarray(im, dtype=np.float32).ravel() for im in images]), np.array([y for _, y in samples])


def choose(make: Any, grid: list[dict[str, Any]], splits: Sequence[tuple[np.ndarray, np.ndarray]]
           ) -> dict[str, Any]:
    """The setting of ``grid`` whose model, fitted on train, scores best on val (the first of ties): its test top-1."""
    (xtr, ytr), (xva, yva), (xte, yte) = splits
    models = [make(**params).fit(xtr, ytr) for params in grid]
    val = [model.score(xva, yva) for model in models]
    best = int(np.argmax(val))
    return {"acc": float(models[best].score(xte, yte)), "params": grid[best], "val": float(val[best])}


def pixel_arm(arm: str, folder: Path) -> dict[str, Any]:
    """logreg (standardised pixels), svm or knn on a split folder's raw pixels, chosen on val; test top-1."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    start = time.perf_counter()
    splits = [read_pixels(folder / s) for s in ("train", "val", "test")]
    if arm == "logreg":
        scaler = StandardScaler().fit(splits[0][0])
        splits = [(scaler.transform(x), y) for x, y in splits]
        run = choose(lambda C: LogisticRegression(C=C, max_iter=2000), [{"C": c} for c in LOGREG_C], splits)
    elif arm == "svm":
        scale = 1.0 / float(splits[0][0].shape[1] * splits[0][0].var())  # a float for the JSON
        run = choose(SVC, [{"C": c, "gamma": g * scale} for c in SVM_C for g in SVM_GAMMA], splits)
    else:
        run = choose(KNeighborsClassifier, [{"n_neighbors": k} for k in NEIGHBOURS], splits)
    return {**run, "seconds": time.perf_counter() - start}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    accs = [r["acc"] for r in runs]
    return {"accs": accs, "mean": statistics.fmean(accs), "spread": max(accs) - min(accs),
            "seconds": statistics.fmean(r["seconds"] for r in runs)}


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = ["| folder | arm | test top-1 (seeds) | mean | spread | wall s | vs loop |",
             "|---|---|---|---:|---:|---:|---:|"]
    for folder, arms in results.items():
        loop = arms.get("loop", {}).get("mean")
        for arm, s in arms.items():
            delta = f"{100 * (s['mean'] - loop):+.1f}" if loop is not None and arm != "loop" else ""
            seeds = ", ".join(f"{a:.3f}" for a in s["accs"])
            lines.append(f"| {folder} | {arm} | {seeds} | {s['mean']:.3f} | {s['spread']:.3f} | {s['seconds']:.0f} "
                         f"| {delta} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("folders", nargs="+", type=Path, help="split folders (train/ val/ test/)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 for every training arm")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="loop and parity epochs (and the recipe's, "
                        "scaled, when not the default)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of every arm")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads of every arm")
    parser.add_argument("--recipe_args", default="", help="more `vit fit` flags for the recipe arm: the knobs "
                        "its config documents, e.g. \"--data.init_args.hflip 0\" for digits")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--_loop", type=int, help=argparse.SUPPRESS)  # internal: run the loop for this seed
    args = parser.parse_args(argv)
    if args._loop is not None:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(plain_loop(args.folders[0], args._loop, args.epochs, args.workers)))
        return {}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for folder in args.folders:
        missing = [s for s in ("train", "val", "test") if not (folder / s).is_dir()]
        if missing:
            raise SystemExit(f"{folder} lacks {', '.join(missing)}/: build folders with "
                             "scripts/experiments/small_folders.py")
        arms: dict[str, dict[str, Any]] = {}
        for arm in args.arms:
            if arm in PIXEL_ARMS:
                run = pixel_arm(arm, folder)
                arms[arm] = {**summarize([run]), "runs": [run]}
            else:
                runs = []
                for seed in range(args.seeds):
                    runs.append(run_arm(arm, folder, seed, args.epochs, args.workers, args.threads,
                                        shlex.split(args.recipe_args)))
                    print(f"{folder.name} {arm} seed {seed}: {runs[-1]['acc']:.4f} in {runs[-1]['seconds']:.0f} s",
                          flush=True)
                arms[arm] = {**summarize(runs), "runs": runs}
        results[folder.name] = arms
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
