"""Plots a person would rather look at than read: the confusion matrix of a test run."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from torch import Tensor


def save_confusion_matrix(confusion: Tensor, class_names: Sequence[str], path: str | os.PathLike) -> Path:
    """Plot a (C, C) confusion matrix to a PNG: row i is the true class, column j the predicted one."""
    n = len(class_names)
    side = min(20.0, max(4.0, 0.45 * n + 2))
    fig = Figure(figsize=(side, side))  # not pyplot: no window, no global state
    ax = fig.subplots()
    ax.imshow(confusion.cpu().numpy(), cmap="Blues")
    if n <= 30:
        ax.set_xticks(range(n), class_names, rotation=90)
        ax.set_yticks(range(n), class_names)
        top = confusion.max().item()
        for i in range(n):
            for j in range(n):
                v = int(confusion[i, j])
                ax.text(j, i, v, ha="center", va="center", fontsize=8, color="white" if v > top / 2 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(f"confusion matrix ({int(confusion.sum())} images)")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
