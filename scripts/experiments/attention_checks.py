"""Do the attention maps mean something? Deletion/insertion AUCs, cascading randomisation, the pointing game.

Trains two small ViTs on the CPU with a plain loop, offline:
* digits: `vit_digits_patch2_8` on scikit-learn's 8x8 digits (80% train, 20% held out), then deletion and
  insertion curves for the cls map, rollout and gradient rollout on the held-out digits, against a random
  patch order, and the cascading model-randomisation check (Adebayo et al., 2018);
* the pointing game: a 16x16 ViT with 4x4 patches on `vit.explain.checks.pointing_set` (one informative patch
  per image, its pattern the class, at a random place), then each map's hit rate on held-out images.
Prints markdown tables (docs/attention.md holds a run's) and, with --json, writes the numbers.

    python scripts/experiments/attention_checks.py
    python scripts/experiments/attention_checks.py --steps 600 --json checks.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import vit
from vit.explain.checks import MAPS, cascading_randomisation, faithfulness_table, pointing_game, pointing_set
from vit.nn.vision import VisionTransformer


def train(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, steps: int, lr: float = 3e-3) -> None:
    """AdamW with a one-cycle schedule on random batches of 64; leaves the model in eval mode."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.15)
    model.train()
    for _ in range(steps):
        idx = torch.randint(len(labels), (64,))
        loss = F.cross_entropy(model(images[idx]), labels[idx], label_smoothing=0.1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()


def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return float(model(images).argmax(-1).eq(labels).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="training steps per model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    started = time.time()
    out: dict = {}

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    labels = torch.tensor(digits.target)
    order = torch.randperm(len(labels))
    train_idx, test_idx = order[:1440], order[1440:]
    mean, std = images[train_idx].mean(), images[train_idx].std()
    images = (images - mean) / std
    model = vit.create_model("vit_digits_patch2_8")
    train(model, images[train_idx], labels[train_idx], args.steps)
    test_images, test_labels = images[test_idx], labels[test_idx]
    out["digits_accuracy"] = accuracy(model, test_images, test_labels)
    print(f"digits: test accuracy {out['digits_accuracy']:.3f} on {len(test_idx)} held-out digits")

    table = faithfulness_table(model, test_images)
    out["faithfulness"] = table
    print("\n| map | MoRF deletion AUC (lower is better) | LeRF deletion AUC (higher) | insertion AUC (higher) |")
    print("|---|---:|---:|---:|")
    for name, aucs in table.items():
        print(f"| {name} | {aucs['MoRF deletion']:.3f} | {aucs['LeRF deletion']:.3f} | {aucs['insertion']:.3f} |")
    any_map = next(iter(table.values()))
    print(f"| random order | {any_map['random deletion']:.3f} | {any_map['random deletion']:.3f} | "
          f"{any_map['random insertion']:.3f} |")

    randomised = cascading_randomisation(model, test_images)
    out["randomisation"] = randomised
    steps = randomised["steps"]
    print("\n| randomised | " + " | ".join(MAPS) + " |")
    print("|---|" + "---:|" * len(MAPS))
    for i, step in enumerate(steps):
        print(f"| {step} | " + " | ".join(f"{randomised[name][i]:.3f}" for name in MAPS) + " |")

    torch.manual_seed(args.seed)
    train_x, train_y, _ = pointing_set(4000, seed=args.seed)
    test_x, test_y, test_cells = pointing_set(500, seed=args.seed + 1)
    pointer = VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=4, embed_dim=32, depth=2,
                                num_heads=2, mlp_ratio=2.0)
    train(pointer, train_x, train_y, args.steps)
    out["pointing_accuracy"] = accuracy(pointer, test_x, test_y)
    out["pointing"] = {name: pointing_game(fn(pointer, test_x), test_cells) for name, fn in MAPS.items()}
    print(f"\npointing game: classifier accuracy {out['pointing_accuracy']:.3f} on 500 held-out images")
    print("| map | hit rate |\n|---|---:|")
    for name, rate in out["pointing"].items():
        print(f"| {name} | {rate:.3f} |")
    print(f"\n(chance: 1/16 = 0.062; {time.time() - started:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
