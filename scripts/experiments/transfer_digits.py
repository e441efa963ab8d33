"""Transfer, shown offline on a CPU: pre-train a small ViT on digits 0-4, then learn digits 5-9 from
10 labelled images per class, three ways, and compare their test top-1.

    scratch        a fresh ViT trained on the 50 images
    linear probe   the pre-trained backbone frozen, a new head trained  (finetune: linear_probe)
    fine-tune      everything trained, layer-wise LR decay 0.75          (finetune: full)

All three run the same number of steps with the same augmentation, and get the same tuning effort: the
learning rate is picked from the same grid on a validation set of 10 more labelled images per class.
The test set is the digits test split of classes 5-9 (the one `vit.data.Digits` holds out). Results
are averaged over a few draws of the labelled images.

    python scripts/experiments/transfer_digits.py                  # about 3 minutes on 2 CPU cores
    python scripts/experiments/transfer_digits.py --seeds 0 1 2 3 4 --json transfer.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch import Trainer, seed_everything
from torch.utils.data import DataLoader, Dataset

from vit.data import Digits
from vit.tasks import ImageClassifier, Optimization
from vit.tasks.finetune import Full, LinearProbe

MODEL = "vit_digits_patch4_16"  # dim 64, depth 4, 4 heads, 16x16 input in 4x4 patches
METHODS = {"scratch": {}, "linear probe": {"finetune": LinearProbe()},
           "fine-tune": {"finetune": Full(), "layer_decay": 0.75}}  # layer_decay: an optim setting


class Relabelled(Dataset):
    """Some samples of a digits split, their labels shifted so the first class is 0."""

    def __init__(self, dataset: Dataset, indices: list[int], offset: int) -> None:
        self.dataset, self.indices, self.offset = dataset, indices, offset

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x, y = self.dataset[self.indices[i]]
        return x, int(y) - self.offset


def pick(dataset: Dataset, classes: range, per_class: int | None, seed: int, skip: int = 0) -> list[int]:
    """Indices of ``per_class`` samples of each class (all if None), after skipping ``skip`` of each."""
    labels = torch.as_tensor(dataset.labels)
    g = torch.Generator().manual_seed(seed)
    chosen = []
    for c in classes:
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)][skip:]
        chosen += idx[: per_class if per_class is not None else len(idx)].tolist()
    return chosen


def trainer(steps: int, root: Path) -> Trainer:
    return Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
                   num_sanity_val_steps=0, limit_val_batches=0)


def accuracy(model: ImageClassifier, dataset: Dataset) -> float:
    x, y = map(torch.stack, zip(*[(x, torch.tensor(y)) for x, y in dataset]))
    model.eval()
    with torch.no_grad():
        return (model(x).argmax(-1) == y).float().mean().item()


def pretrain(data: Digits, epochs: int, root: Path) -> Path:
    """A ViT trained on every training image of digits 0-4; returns its checkpoint."""
    train = Relabelled(data.train_set, pick(data.train_set, range(5), None, 0), 0)
    model = ImageClassifier(model=MODEL, num_classes=5, optim=Optimization(lr=4e-3, warmup_epochs=2, min_lr=1e-5),
                            model_kwargs={"drop_path_rate": 0.1})
    steps = epochs * (len(train) // 64)
    fit = trainer(steps, root)
    fit.fit(model, DataLoader(train, batch_size=64, shuffle=True, drop_last=True))
    test = Relabelled(data.test_set, pick(data.test_set, range(5), None, 0), 0)
    print(f"pre-trained on {len(train)} images of digits 0-4 for {steps} steps: test top-1 {accuracy(model, test):.3f}")
    path = root / "digits_0_4.ckpt"
    fit.save_checkpoint(path)
    return path


def learn(
    method: str, lr: float, pretrained: Path | None, train: Dataset, steps: int, root: Path, seed: int
) -> ImageClassifier:
    """One run of ``method`` on the labelled images of digits 5-9, seeded with ``seed``.

    Seeded here, not once per script: the new head (or the whole scratch model), the batch order and the
    augmentation then depend on this run alone, so a draw scores the same whichever draws ran before it,
    and every learning rate of the grid starts from the same weights.
    """
    seed_everything(seed, verbose=False)
    options = dict(METHODS[method])
    optim = Optimization(lr=lr, warmup_steps=steps // 10, min_lr=lr / 100, layer_decay=options.pop("layer_decay", None))
    model = ImageClassifier(model=MODEL, num_classes=5, optim=optim, pretrained=str(pretrained) if pretrained else None,
                            **options)
    if pretrained:
        model.configure_model()  # load the 0-4 weights now (a Trainer would, but after the reset below)
        model.model.reset_classifier(5)  # the 0-4 head has the right shape, but means other classes
    trainer(steps, root).fit(model, DataLoader(train, batch_size=len(train), shuffle=True))
    return model


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labels_per_class", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100, help="optimiser steps for every method")
    parser.add_argument("--pretrain_epochs", type=int, default=30)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2], help="the grid, for all")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="draws of the labelled images")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # this model is too small to gain from more
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no banner per run
    start = time.perf_counter()
    seed_everything(0, verbose=False)
    data = Digits(img_size=16)
    data.setup("fit")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = pretrain(data, args.pretrain_epochs, root)
        test = Relabelled(data.test_set, pick(data.test_set, range(5, 10), None, 0), 5)
        scores: dict[str, list[float]] = {m: [] for m in METHODS}
        for seed in args.seeds:
            train = Relabelled(data.train_set, pick(data.train_set, range(5, 10), args.labels_per_class, seed), 5)
            val_idx = pick(data.val_set, range(5, 10), args.labels_per_class, seed)
            val = Relabelled(data.val_set, val_idx, 5)
            for method in METHODS:
                pretrained = None if method == "scratch" else checkpoint
                best = max(((accuracy(m := learn(method, lr, pretrained, train, args.steps, root, seed), val), lr, m)
                            for lr in args.lrs), key=lambda r: r[0])
                scores[method].append(accuracy(best[2], test))
                print(f"seed {seed}, {method:<12} lr {best[1]:g} (val {best[0]:.2f}): "
                      f"test top-1 {scores[method][-1]:.3f}")
    summary = {m: {"mean": statistics.mean(s), "runs": s} for m, s in scores.items()}
    print(f"\ndigits 5-9 from {args.labels_per_class} labelled images per class, {args.steps} steps each, "
          f"test top-1 over {len(args.seeds)} draws ({len(test)} test images):")
    for method, result in summary.items():
        print(f"  {method:<12} {result['mean']:.3f}  ({', '.join(f'{v:.3f}' for v in result['runs'])})")
    print(f"in {time.perf_counter() - start:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
