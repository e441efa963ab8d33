"""A known multi-label answer, measured: composites of scikit-learn's digits, side by side with two baselines.

    python scripts/experiments/multilabel_digits.py --seeds 0 1 2 --json multilabel.json

Each composite is a 2x2 grid of 8x8 digit images (16x16 px): 1 to 3 different digits in random cells, blank
elsewhere; its labels are that set. The digit images are split first (60% train, 15% val, 25% test), so the test
composites are built from digit images no training composite uses. The folder is what a user would have: PNGs
beside a ``metadata.csv`` of ``file_name,labels,split`` ("1;3;7"). The arms, on the very same split:

    recipe   `vit fit --config configs/multilabel_cpu.yaml --data.init_args.root DIR --data.init_args.hflip 0`
             (the knob its config documents for digits), in its own process; its best checkpoint tested.
    timm     a plain loop: timm's VisionTransformer of the same size (dim 96, depth 4, 4 heads, 16 tokens: 16 px
             in 4 px patches), AdamW (lr 1e-3, wd 0.05) + OneCycle, batch 64, the same 40 epochs, BCE, no
             augmentation, final weights tested.
    logreg   scikit-learn's one-vs-rest logistic regression on the 256 pixels (C = 1).

Figures: test macro mAP, micro F1 (at 0.5 for the baselines; at the thresholds chosen on val for the recipe),
exact-set accuracy, and each arm's wall time (the recipe's includes its process start and the test).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SPLITS = {"train": 3000, "val": 500, "test": 1000}
CELLS = [(0, 0), (0, 8), (8, 0), (8, 8)]


def write_composites(root: Path, sizes: dict[str, int] = SPLITS, seed: int = 0) -> Path:
    """Write the composites as PNGs under ``root/images`` and ``root/metadata.csv``; returns ``root``."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(digits.target))
    cut = np.cumsum([0.6, 0.15]) * len(order)
    pools = dict(zip(("train", "val", "test"), np.split(order, cut.astype(int))))
    (root / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for split, n in sizes.items():
        pool = pools[split]
        by_digit = {d: pool[digits.target[pool] == d] for d in range(10)}
        for i in range(n):
            chosen = rng.choice(10, size=int(rng.integers(1, 4)), replace=False)
            canvas = np.zeros((16, 16), dtype=np.uint8)
            for digit, cell in zip(chosen, rng.permutation(4)):
                y, x = CELLS[cell]
                image = digits.images[rng.choice(by_digit[int(digit)])]
                canvas[y:y + 8, x:x + 8] = np.clip(image * 16, 0, 255).astype(np.uint8)
            name = f"images/{split}_{i:05d}.png"
            Image.fromarray(canvas).save(root / name)
            rows.append((name, ";".join(str(d) for d in sorted(chosen)), split))
    with (root / "metadata.csv").open("w", newline="") as f:
        csv.writer(f).writerows([("file_name", "labels", "split"), *rows])
    return root


def read_split(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(pixels (N, 16, 16) in [0, 1], multi-hot targets (N, 10)) of one split."""
    from PIL import Image

    rows = [r for r in csv.DictReader((root / "metadata.csv").open()) if r["split"] == split]
    pixels = np.stack([np.asarray(Image.open(root / r["file_name"]), dtype=np.float32) / 255 for r in rows])
    targets = np.zeros((len(rows), 10), dtype=np.float32)
    for i, r in enumerate(rows):
        targets[i, [int(d) for d in r["labels"].split(";")]] = 1
    return pixels, targets


def scores(probs: np.ndarray, targets: np.ndarray, cut: float = 0.5) -> dict[str, float]:
    """Macro mAP, micro F1 and exact-set accuracy, by scikit-learn."""
    from sklearn.metrics import average_precision_score, f1_score

    said = probs >= cut
    return {"map": float(average_precision_score(targets, probs, average="macro")),
            "f1_micro": float(f1_score(targets, said, average="micro")),
            "exact_match": float((said == targets.astype(bool)).all(1).mean())}


def logreg_arm(root: Path, seed: int) -> dict[str, float]:
    """One-vs-rest logistic regression on the pixels (C = 1)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    (x, y), (xt, yt) = read_split(root, "train"), read_split(root, "test")
    model = OneVsRestClassifier(LogisticRegression(C=1.0, max_iter=2000, random_state=seed))
    model.fit(x.reshape(len(x), -1), y)
    return scores(model.predict_proba(xt.reshape(len(xt), -1)), yt)


def timm_arm(root: Path, seed: int, epochs: int) -> dict[str, float]:
    """The plain loop: timm's ViT, AdamW + OneCycle, BCE, final weights."""
    import torch
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    (x, y), (xt, yt) = read_split(root, "train"), read_split(root, "test")
    x, y, xt = (torch.from_numpy(a) for a in (x, y, xt))
    x, xt = (x[:, None] - 0.5) / 0.5, (xt[:, None] - 0.5) / 0.5
    model = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=10, embed_dim=96, depth=4,
                              num_heads=4, drop_path_rate=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    batches = -(-len(x) // 64)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 1e-3, total_steps=epochs * batches, pct_start=0.1)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(x)).split(64):
            loss = loss_fn(model(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    with torch.no_grad():
        probs = torch.cat([model(b).sigmoid() for b in xt.split(256)]).numpy()
    return scores(probs, yt)


def recipe_arm(root: Path, seed: int, epochs: int) -> dict[str, float]:
    """`vit fit` with the multi-label recipe, in its own process; the test figures of its best checkpoint."""
    with tempfile.TemporaryDirectory() as work:
        cmd = [sys.executable, "-m", "vit", "fit", "--config", str(ROOT / "configs" / "multilabel_cpu.yaml"),
               f"--data.init_args.root={root}", "--data.init_args.hflip=0", f"--seed_everything={seed}",
               f"--trainer.max_epochs={epochs}", "--trainer.enable_progress_bar=false"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env)
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        metrics = next(Path(work).rglob("metrics.csv"))
        last = {}
        for row in csv.DictReader(metrics.open()):
            last.update({k: float(v) for k, v in row.items() if v and k.startswith("test_")})
        printed = [line for line in done.stdout.splitlines() if line.startswith("test ")]
        return {"map": last["test_map"], "f1_micro": last["test_f1_micro"], "exact_match": last["test_exact_match"],
                "printed": printed[-1] if printed else ""}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--arms", nargs="+", default=["recipe", "timm", "logreg"])
    parser.add_argument("--folder", type=Path, default=None, help="where the composites go (default: a temp folder)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(2)
    folder = args.folder or Path(tempfile.mkdtemp(prefix="multilabel_digits_"))
    if not (folder / "metadata.csv").is_file():
        write_composites(folder)
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            start = time.perf_counter()
            if arm == "recipe":
                result = recipe_arm(folder, seed, args.epochs)
            elif arm == "timm":
                result = timm_arm(folder, seed, args.epochs)
            else:
                result = logreg_arm(folder, seed)
            result["seconds"] = time.perf_counter() - start
            results[arm].append({"seed": seed, **result})
            print(arm, seed, {k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}, flush=True)
    print("| arm | macro mAP (seeds) | mean mAP | micro F1 | exact-set | seconds |")
    print("|---|---|---|---|---|---|")
    for arm, rows in results.items():
        mean = lambda key: np.mean([r[key] for r in rows])  # noqa: B023
        per_seed = " / ".join(f"{r['map']:.3f}" for r in rows)
        print(f"| {arm} | {per_seed} | {mean('map'):.3f} | {mean('f1_micro'):.3f} | {mean('exact_match'):.3f} | "
              f"{mean('seconds'):.0f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
