"""Few labels, many images, shown offline on a CPU: MAE-pretrain a small ViT on unlabelled digits, then learn
all ten classes from 10 labelled images per class, three ways, and compare their test top-1.

    scratch        a fresh ViT trained on the 100 labelled images
    MAE fine-tune  the MAE encoder, everything trained, layer-wise LR decay 0.75   (finetune: full)
    MAE probe      the MAE encoder frozen, a new linear head trained               (finetune: linear_probe)

The digits' test split (359 images, `vit.data.Digits`) is set apart; the other 1,438 images are the
unlabelled pool that MAE pre-trains on (their labels unused), with configs/pretrain/mae_digits.yaml's
settings. Each draw takes 10 labelled images per class from the pool, and 10 more per class as the
validation set that picks the learning rate. Every arm gets the same steps, the same augmentation and the
same lr grid, and each run starts from ``seed_everything(draw)``, so a draw reproduces alone whatever ran
before it. Each step budget (``--steps``) is a comparison of its own: from scratch a ViT needs many more
steps than a pre-trained one, so a short budget alone would flatter MAE.

    python scripts/experiments/pretrain_digits.py    # the README table: 100, 200 and 400 steps, ~12 min on 1 thread
    python scripts/experiments/pretrain_digits.py --steps 100 --json mae_digits.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import Trainer, seed_everything
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from vit.data import Digits
from vit.data.digits import DIGITS_MEAN, DIGITS_STD
from vit.tasks import ImageClassifier, MaskedAutoencoder, Optimization
from vit.tasks.finetune import Full, LinearProbe

MODEL = "vit_digits_patch4_16"  # dim 64, depth 4, 4 heads, 16x16 input in 4x4 patches (configs/digits.yaml's)
ARMS = {"scratch": {}, "MAE fine-tune": {"finetune": Full(), "layer_decay": 0.75},  # layer_decay: an optim setting
        "MAE probe": {"finetune": LinearProbe()}}


def trainer(steps: int, root: Path) -> Trainer:
    return Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
                   num_sanity_val_steps=0, limit_val_batches=0)


def random_affine(x: Tensor, max_rotation: float = 8.0, max_shift: float = 1.0,
                  zoom: tuple[float, float] = (0.9, 1.1)) -> Tensor:
    """configs/digits.yaml's augmentation (rotation within 8 degrees, shift within 1 pixel, zoom 0.9-1.1, bilinear),
    drawn per image but applied to the batch (B, 1, S, S) of 0..1 images at once: a per-image torchvision
    RandomAffine costs as much as the tiny model's step."""
    B, _, S, _ = x.shape
    angle = (torch.rand(B) * 2 - 1) * math.radians(max_rotation)
    scale = torch.empty(B).uniform_(*zoom)
    shift = (torch.rand(B, 2) * 2 - 1) * max_shift * 2 / S  # in affine_grid's -1..1 coordinates
    cos, sin = angle.cos() / scale, angle.sin() / scale  # the inverse map: output pixel -> input pixel
    theta = torch.stack([torch.stack([cos, -sin, -(cos * shift[:, 0] - sin * shift[:, 1])], 1),
                         torch.stack([sin, cos, -(sin * shift[:, 0] + cos * shift[:, 1])], 1)], 1)  # (B, 2, 3)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def normalise(x: Tensor) -> Tensor:
    return (x - DIGITS_MEAN[0]) / DIGITS_STD[0]


def batches(images: Tensor, labels: Tensor, batch_size: int, augment: bool) -> DataLoader:
    """Shuffled batches of normalised 0..1 images (N, 1, S, S), randomly transformed when ``augment``."""
    def collate(samples: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        x, y = map(torch.stack, zip(*samples))
        return normalise(random_affine(x) if augment else x), y

    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=True,
                      drop_last=len(images) > batch_size, collate_fn=collate)


def pretrain(pool: Tensor, args: argparse.Namespace, root: Path) -> Path:
    """MAE on the pool for ``args.mae_epochs`` epochs; returns its checkpoint."""
    seed_everything(0, verbose=False)
    width, depth, heads = args.decoder
    mae = MaskedAutoencoder(model=MODEL, img_size=16, in_chans=1, mean=DIGITS_MEAN, std=DIGITS_STD,
                            decoder_dim=width, decoder_depth=depth,
                            decoder_heads=heads, norm_pix_loss=not args.pixel_targets, lr=args.mae_lr,
                            warmup_epochs=10, min_lr=1e-5, figure_images=0)
    fit = trainer(args.mae_epochs * (len(pool) // args.mae_batch), root)
    start = time.perf_counter()
    fit.fit(mae, batches(pool, torch.zeros(len(pool), dtype=torch.long), args.mae_batch, augment=True))
    print(f"MAE: {fit.global_step} steps ({args.mae_epochs} epochs of {len(pool)} unlabelled images) in "
          f"{time.perf_counter() - start:.0f} s, final train loss {fit.callback_metrics['train_loss']:.3f}")
    path = root / "mae_digits.ckpt"
    fit.save_checkpoint(path)
    return path


def pick(labels: torch.Tensor, per_class: int, seed: int, skip: int = 0) -> list[int]:
    """``per_class`` indices of each class, after the first ``skip`` of a seeded shuffle of each."""
    g = torch.Generator().manual_seed(seed)
    chosen = []
    for c in range(10):
        idx = torch.nonzero(labels == c).flatten()
        chosen += idx[torch.randperm(len(idx), generator=g)][skip:skip + per_class].tolist()
    return chosen


def accuracy(model: ImageClassifier, images: Tensor, labels: Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return (model(normalise(images)).argmax(-1) == labels).float().mean().item()


def learn(arm: str, lr: float, mae: Path | None, train: DataLoader, steps: int, root: Path, seed: int
          ) -> ImageClassifier:
    """One run of ``arm`` at ``lr``, from ``seed_everything(seed)``: the head (or the whole scratch model), the
    batch order and the augmentation depend on this run alone."""
    seed_everything(seed, verbose=False)
    options = dict(ARMS[arm])
    optim = Optimization(lr=lr, warmup_steps=steps // 10, min_lr=lr / 100, layer_decay=options.pop("layer_decay", None))
    model = ImageClassifier(model=MODEL, num_classes=10, img_size=16, in_chans=1, optim=optim,
                            pretrained=str(mae) if mae else None, **options)
    trainer(steps, root).fit(model, train)
    return model


def compare(steps: int, mae: Path, pool: Tensor, pool_labels: Tensor, test: Any, args: argparse.Namespace,
            root: Path) -> dict[str, dict[str, list[float]]]:
    """Every arm on every draw at ``steps`` steps: the test top-1 of the lr the validation images chose, and
    that validation accuracy."""
    results = {arm: {"test": [], "val": [], "lr": []} for arm in ARMS}
    for draw in args.draws:
        labelled = pick(pool_labels, args.labels_per_class, draw)
        train = batches(pool[labelled], pool_labels[labelled], len(labelled), augment=True)  # one batch a step
        val = pick(pool_labels, args.labels_per_class, draw, skip=args.labels_per_class)
        for arm, result in results.items():
            weights = None if arm == "scratch" else mae
            runs = [(accuracy(m := learn(arm, lr, weights, train, steps, root, draw), pool[val], pool_labels[val]),
                     lr, m) for lr in args.lrs]
            val_acc, lr, best = max(runs, key=lambda r: r[0])
            result["test"].append(accuracy(best, test.images, test.labels))
            result["val"].append(val_acc)
            result["lr"].append(lr)
            print(f"{steps} steps, draw {draw}, {arm:<13} lr {lr:g} (val {val_acc:.2f}): "
                  f"test top-1 {result['test'][-1]:.3f}", flush=True)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labels_per_class", type=int, default=10)
    parser.add_argument("--steps", type=int, nargs="+", default=[100, 200, 400],
                        help="optimiser steps of every arm; each budget is a comparison of its own")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2], help="the grid, for every arm")
    parser.add_argument("--draws", type=int, nargs="+", default=[0, 1, 2], help="draws of the labelled images")
    parser.add_argument("--mae_epochs", type=int, default=300)
    parser.add_argument("--mae_lr", type=float, default=1.5e-3)
    parser.add_argument("--mae_batch", type=int, default=128)
    parser.add_argument("--decoder", type=int, nargs=3, default=[64, 2, 4], metavar=("WIDTH", "DEPTH", "HEADS"))
    parser.add_argument("--pixel_targets", action="store_true", help="MAE without norm_pix_loss")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # this model is too small to gain from more
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no banner per run
    # "no classifier head" at every MAE load: expected
    logging.getLogger("vit.checkpoints.weights").setLevel(logging.ERROR)
    start = time.perf_counter()
    data = Digits(img_size=16)
    data.setup("fit")
    pool = torch.cat([data.train_set.images, data.val_set.images])  # 0..1 (N, 1, 16, 16); labels for drawing only
    pool_labels = torch.cat([data.train_set.labels, data.val_set.labels])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        mae = pretrain(pool, args, root)
        summary: dict[str, Any] = {str(steps): compare(steps, mae, pool, pool_labels, data.test_set, args, root)
                                   for steps in args.steps}
    summary["seconds"] = seconds = time.perf_counter() - start
    print(f"\nall ten digits from {args.labels_per_class} labelled images per class, test top-1 over "
          f"{len(args.draws)} draws ({len(data.test_set)} test images), {seconds:.0f} s in all:")
    for steps in args.steps:
        results = summary[str(steps)]
        print(f"{steps} steps per run:")
        for arm, result in results.items():
            runs = result["test"]
            print(f"  {arm:<13} {statistics.mean(runs):.3f}  ({', '.join(f'{v:.3f}' for v in runs)})")
        gains = [m - s for m, s in zip(results["MAE fine-tune"]["test"], results["scratch"]["test"])]
        print(f"  MAE fine-tune - scratch: {statistics.mean(gains):+.3f} mean, {min(gains):+.3f} on the worst draw")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
