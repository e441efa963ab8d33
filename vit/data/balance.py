"""Class balance of a training split: the per-class count report, the warning (with runnable advice) when the
classes are far from balanced, and the sampler that draws them evenly (``balanced_sampling``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import WeightedRandomSampler

from vit.errors import UserValueError

# The imbalance warning's advice, as `vit fit` flags: the multi-label head is named because a weighting given to the
# default head alone makes it a single-label one (`vit.tasks.heads.head_for`).
CLASS_WEIGHTING = "--model.init_args.head.init_args.class_weighting true"
MULTI_LABEL_HEAD = "--model.init_args.head.class_path vit.tasks.heads.MultiLabelHead"


def imbalance_advice(multi_label: bool) -> str:
    """The flags that weigh rare classes up, as `vit fit` takes them (a test runs them as printed)."""
    if multi_label:  # (a multi-label image has no one class to draw it by)
        return f"{MULTI_LABEL_HEAD} {CLASS_WEIGHTING}"
    return f"--data.init_args.balanced_sampling true, or {CLASS_WEIGHTING}"


def report_class_counts(root: Path | str, names: Sequence[str], counts: Sequence[int], multi_label: bool,
                        balanced: bool = False) -> None:
    """Print the training images per class, and warn when the classes are far from balanced (unless ``balanced``:
    the sampler already draws them evenly, so the advice would name what is on); a class with no training image is
    an error."""
    if 0 in counts:  # (all its files bad, or its only rows held out): nothing to learn it from
        missing = [name for name, n in zip(names, counts) if n == 0]
        raise UserValueError(f"{root}: no training image of class {', '.join(map(repr, missing[:5]))}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                             + ": add images of it to train, or leave it out of the data")
    shown = list(zip(names, counts))
    if len(shown) > 40:  # ImageNet-sized: the extremes say enough
        shown = sorted(shown, key=lambda c: c[1])
        shown = [*shown[:5], ("...", None), *shown[-5:]]
    width = max(len(name) for name, _ in shown)
    rank_zero_info("training images per class:\n" + "\n".join(
        f"  {name:<{width}} {'' if n is None else n:>8}" for name, n in shown))
    smallest, largest = min(counts), max(counts)
    if smallest < 0.1 * largest:
        small = names[list(counts).index(smallest)]
        found = (f"{root}: imbalanced classes: {small!r} has {smallest} training images, under 10% of the "
                 f"largest class's {largest}")
        if balanced:
            rank_zero_info(f"{found}; drawn evenly (balanced_sampling)")
        else:
            rank_zero_warn(f"{found}; consider {imbalance_advice(multi_label)}")


def balanced_sampler(counts: Sequence[int], labels: Sequence[int]) -> WeightedRandomSampler:
    """Draws weighted by 1 / (images of the class), with replacement: every class about equally often."""
    weights = (1.0 / torch.tensor(counts, dtype=torch.float64))[torch.as_tensor(labels)]
    return WeightedRandomSampler(weights, num_samples=len(weights), replacement=True)
