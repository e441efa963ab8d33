"""Figures a person would rather look at than read: PNG charts for runs and audits (one plotting home).

Built on matplotlib's object API (``Figure``, not pyplot): no window, no global state, any backend.
Files are written atomically and honour the umask (`vit.files.save_atomic`).
"""

from __future__ import annotations

import io
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from vit.files import save_atomic


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    """A figure as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def save_figure(fig: Figure, path: str | os.PathLike, dpi: int = 100) -> Path:
    """Write a figure as a PNG file, atomically."""
    data = png_bytes(fig, dpi)
    return save_atomic(lambda f: f.write(data), path)


def to_display_image(
    image: Tensor | np.ndarray,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    *,
    min_side: int | None = None,
) -> np.ndarray:
    """An image as float (H, W, 3) in [0, 1] for plotting; undoes mean/std normalisation if given.

    Accepts a tensor (C, H, W) or an array (H, W), (H, W, C) with values in [0, 1] or [0, 255].
    ``min_side`` repeats pixels (nearest neighbour) until the short side reaches it, so a small
    input such as an 8x8 digit gets a smooth heat map over visible square pixels.
    """
    if isinstance(image, Tensor):
        if image.dim() != 3:
            raise ValueError(f"expected an image tensor shaped (channels, H, W), got {tuple(image.shape)}")
        image = image.detach().cpu().float()
        if mean is not None and std is not None:
            image = image * torch.tensor(std).view(-1, 1, 1) + torch.tensor(mean).view(-1, 1, 1)
        array = image.permute(1, 2, 0).numpy()  # (C, H, W) -> (H, W, C)
    else:
        array = np.asarray(image, dtype=np.float32)
        if array.ndim == 2:
            array = array[..., None]
        if array.max() > 1.0:
            array = array / 255.0
    if array.ndim != 3 or array.shape[-1] not in (1, 3):
        raise ValueError(f"expected a grayscale or RGB image, got shape {array.shape}")
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    if min_side is not None and min(array.shape[:2]) < min_side:
        factor = -(-min_side // min(array.shape[:2]))  # ceiling division
        array = array.repeat(factor, axis=0).repeat(factor, axis=1)
    return np.clip(array, 0.0, 1.0)


def confusion_matrix_figure(confusion: Tensor, class_names: Sequence[str]) -> Figure:
    """A (C, C) confusion matrix: row i is the true class, column j the predicted one."""
    n = len(class_names)
    side = min(20.0, max(4.0, 0.45 * n + 2))
    fig = Figure(figsize=(side, side))
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
    return fig


def save_confusion_matrix(confusion: Tensor, class_names: Sequence[str], path: str | os.PathLike) -> Path:
    """Plot a (C, C) confusion matrix to a PNG."""
    return save_figure(confusion_matrix_figure(confusion, class_names), path)


def reliability_figure(before: dict[str, list[float]], after: dict[str, list[float]], temperature: float | str,
                       title: str, xlabel: str = "confidence (top probability)", ylabel: str = "accuracy",
                       counted: str = "images") -> Figure:
    """Accuracy against confidence per bin, before (T = 1) and after T on one axis, the images per bin beneath
    (a bin of three images swings): the dicts of `vit.deploy.calibration.reliability_bins` (or a multi-label
    model's pooled bins, ``temperature`` then words: "a T per class")."""
    after_name = f"after ({temperature})" if isinstance(temperature, str) else f"after (T = {temperature:.3g})"
    fig = Figure(figsize=(5.2, 5.6))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot([0, 1], [0, 1], "k--", lw=0.8, label="calibrated")
    width = 1 / 15 * 0.4
    for bins, colour, name, shift in ((before, "tab:red", "before (T = 1)", -width / 2),
                                      (after, "tab:blue", after_name, width / 2)):
        top.plot(bins["confidence"], bins["accuracy"], "o-", color=colour, label=name)
        bottom.bar(np.asarray(bins["confidence"]) + shift, bins["count"], width=width, color=colour)
    top.set(ylabel=ylabel, title=title, xlim=(0, 1.02), ylim=(0, 1.02))
    top.legend(loc="upper left", fontsize=8)
    bottom.set(xlabel=xlabel, ylabel=counted, yscale="log")
    bottom.set_ylim(bottom=0.5)  # a bin of one image shows
    fig.tight_layout()
    return fig


def bar_chart(values: Sequence[float], names: Sequence[str], *, title: str, ylabel: str,
              highlight: Sequence[bool] | None = None, series: dict[str, Sequence[float]] | None = None) -> Figure:
    """Bars per name; ``series`` (label -> values) draws grouped bars instead of ``values``; ``highlight``
    colours those names' bars red (e.g. classes that are too small)."""
    series = series or {"": values}
    n = len(names)
    fig = Figure(figsize=(min(16.0, max(5.0, 0.35 * n * max(1, len(series)) + 2)), 3.6))
    ax = fig.subplots()
    width = 0.8 / len(series)
    for k, (label, ys) in enumerate(series.items()):
        xs = np.arange(n) + (k - (len(series) - 1) / 2) * width
        bars = ax.bar(xs, ys, width, label=label or None)
        if highlight is not None and k == 0:
            for bar, flag in zip(bars, highlight):
                if flag:
                    bar.set_color("tab:red")
    if n <= 60:
        ax.set_xticks(range(n), names, rotation=90 if max(map(len, names), default=0) > 3 else 0)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    return fig


def histogram(values: Sequence[float], *, title: str, xlabel: str, bins: int = 30) -> Figure:
    """A histogram of ``values``."""
    fig = Figure(figsize=(5.0, 3.2))
    ax = fig.subplots()
    ax.hist(values, bins=bins, color="tab:blue")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("images")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def class_accuracy_figure(accuracy: Sequence[float], class_names: Sequence[str]) -> Figure:
    """Per-class accuracy (recall) as bars, sorted as the classes are; NaN, a class without test images, is
    written as "no test images" where its bar would be (not drawn as an accuracy of 0)."""
    fig = bar_chart(accuracy, class_names, title="test accuracy per class", ylabel="accuracy")
    ax = fig.axes[0]
    for x, acc in enumerate(accuracy):
        if acc != acc:
            ax.text(x, 0.02, "no test images", rotation=90, ha="center", va="bottom", fontsize=8, color="tab:gray")
    ax.set_ylim(0, 1.05)
    return fig


def error_grid_figure(images: Sequence[np.ndarray], overlays: Sequence[np.ndarray],
                      captions: Sequence[str]) -> Figure:
    """Each mistake as a pair of panels, the image and its attention-rollout overlay, captioned; four mistakes
    to a row. ``images`` and ``overlays`` are (H, W, 3) in [0, 1].

    The panels are pasted into one picture drawn on one axes: 32 axes laid out by matplotlib took a second
    and a half of every `vit test` (a 2-core CPU), this takes a third of that."""
    per_row = 4
    rows = max(1, -(-len(images) // per_row))
    cell_h = max([picture.shape[0] for picture in (*images, *overlays)], default=1)
    cell_w = max([picture.shape[1] for picture in (*images, *overlays)], default=1)
    gap, band = max(1, cell_w // 10), max(1, cell_h // 4)  # between panels; above each pair, for its caption
    pair_w = 2 * cell_w + gap
    canvas = np.ones((rows * (band + cell_h) + gap, per_row * (pair_w + 2 * gap), 3))
    corners = []
    for k, pair in enumerate(zip(images, overlays)):
        top, left = (k // per_row) * (band + cell_h) + band, (k % per_row) * (pair_w + 2 * gap) + gap
        for j, picture in enumerate(pair):
            h, w = picture.shape[:2]
            canvas[top:top + h, left + j * (cell_w + gap):left + j * (cell_w + gap) + w] = picture[..., :3]
        corners.append((left, top))
    fig = Figure(figsize=(per_row * 3.4, rows * 2.0 + 0.4))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0 - 0.4 / (rows * 2.0 + 0.4)))  # the top 0.4 inch for the title
    ax.imshow(canvas, interpolation="nearest")
    ax.axis("off")
    for (left, top), caption in zip(corners, captions):  # two lines at most, as wide as a pair of panels
        caption = textwrap.fill(caption, width=46, max_lines=2, placeholder="...")
        ax.text(left, top - band * 0.1, caption, fontsize=8 if "\n" not in caption else 7, ha="left", va="bottom",
                linespacing=1.0, clip_on=False)
    fig.suptitle("most confident mistakes on the test split (image | attention rollout)", fontsize=10)
    return fig


def precision_recall(scores: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(recall, precision) at each cut of ``scores`` (highest first), for boolean ``positive``."""
    order = np.argsort(-scores, kind="stable")
    tp = np.cumsum(positive[order])
    return tp / max(1, positive.sum()), tp / np.arange(1, len(scores) + 1)


def class_ap_figure(probs: Tensor, targets: Tensor, ap: Tensor, class_names: Sequence[str],
                    worst: int = 4) -> Figure:
    """Per-class average precision as bars (worst first), beside the precision-recall curves of the ``worst``
    classes; ``targets`` are 1/0/-1 (unknown, left out)."""
    ap_np = ap.cpu().numpy()
    order = [int(i) for i in np.argsort(np.nan_to_num(ap_np, nan=2.0), kind="stable")]
    n = len(class_names)
    fig = Figure(figsize=(min(18.0, max(9.0, 0.3 * n + 6)), 3.8))
    bars, curves = fig.subplots(1, 2, width_ratios=[max(1.0, n / 12), 1.0])
    bars.bar(range(n), np.nan_to_num(ap_np[order]), color="tab:blue")
    if n <= 60:
        bars.set_xticks(range(n), [class_names[i] for i in order], rotation=90 if n > 12 else 0)
    bars.set_ylim(0, 1.05)
    bars.set_ylabel("average precision")
    bars.set_title(f"test AP per class (macro mAP {np.nanmean(ap_np):.3f})")
    p, t = probs.cpu().numpy(), targets.cpu().numpy()
    for c in [i for i in order if ap_np[i] == ap_np[i]][:worst]:
        known = t[:, c] >= 0
        recall, precision = precision_recall(p[known, c], t[known, c] == 1)
        curves.plot(recall, precision, label=f"{class_names[c]} (AP {ap_np[c]:.2f})")
    curves.set_xlabel("recall")
    curves.set_ylabel("precision")
    curves.set_xlim(0, 1.02)
    curves.set_ylim(0, 1.05)
    curves.set_title(f"precision-recall of the {worst} worst classes")
    curves.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def cooccurrence_figure(targets: Tensor, class_names: Sequence[str]) -> Figure:
    """How often each pair of labels applies to the same image (the diagonal: each label's images)."""
    positive = (targets == 1).float()
    counts = (positive.T @ positive).cpu()  # (C, C)
    fig = confusion_matrix_figure(counts, class_names)
    ax = fig.axes[0]
    ax.set_xlabel("label")
    ax.set_ylabel("label")
    ax.set_title(f"label co-occurrence ({len(targets)} images; diagonal: images with the label)")
    return fig


def label_errors_figure(images: Sequence[np.ndarray | None], captions: Sequence[str]) -> Figure:
    """Each class's worst false positive and false negative, captioned, three classes (six panels) to a row: a
    class without one of the two has an empty panel there (``None``), so FP and FN keep their columns."""
    per_row, width = 6, 30  # a caption line of 7 pt fits its 2-inch panel at about 30 characters
    wrapped = ["\n".join(textwrap.fill(line, width, subsequent_indent="  ") for line in text.splitlines())
               for text in captions]
    lines = max((text.count("\n") + 1 for text in wrapped), default=1)
    rows = max(1, -(-len(images) // per_row))
    # Placed by hand, in inches: tight_layout let a row's tall captions run over the images above, and the title
    # over the first row's. A 7-pt line is 0.117 in; the title pad 0.08.
    panel, side, title, gap = 2.0, 1.7, 0.4, 0.15
    caption = 0.125 * lines + 0.1
    height = title + rows * (caption + side + gap)
    fig = Figure(figsize=(per_row * panel, height))
    for k in range(rows * per_row):
        row, col = divmod(k, per_row)
        bottom = height - title - row * (caption + side + gap) - caption - side
        ax = fig.add_axes((col * panel / (per_row * panel) + 0.1 / (per_row * panel), bottom / height,
                           side / (per_row * panel), side / height))
        ax.axis("off")
        if k < len(images):
            if images[k] is not None:
                ax.imshow(images[k], interpolation="nearest")
            ax.set_title(wrapped[k], fontsize=7, loc="left", color="black" if images[k] is not None else "grey")
    fig.suptitle("per class: the most confident false positive (FP) and the lowest-scored false negative (FN)",
                 fontsize=10, y=1 - 0.12 / height, va="top")
    return fig


def reconstruction_figure(images: Tensor, reconstructions: Tensor, mask: Tensor, patch_size: Sequence[int],
                          mean: Sequence[float], std: Sequence[float], *, title: str) -> Figure:
    """MAE at work, one column per image: the original, the masked input the encoder saw (hidden patches grey)
    and the reconstruction. ``images`` and ``reconstructions`` are normalised (B, C, H, W); ``mask`` (B, h*w)
    is 1 where a patch was hidden."""
    (ph, pw), n = patch_size, len(images)
    h, w = images.shape[-2] // ph, images.shape[-1] // pw
    fig = Figure(figsize=(max(4.0, 1.3 * n), 4.4))
    axes = fig.subplots(3, n, squeeze=False)
    for k in range(n):
        original = to_display_image(images[k], mean, std)
        hidden = mask[k].reshape(h, w).repeat_interleave(ph, 0).repeat_interleave(pw, 1).bool().numpy()
        masked = original.copy()
        masked[hidden] = 0.5
        for row, picture in enumerate((original, masked, to_display_image(reconstructions[k], mean, std))):
            axes[row, k].imshow(picture.clip(0, 1), interpolation="nearest")
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    for row, name in enumerate(("original", "masked", "reconstruction")):
        axes[row, 0].set_ylabel(name, fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def validation_panel(val: dict[str, Sequence[tuple[int, float]]]) -> tuple[str, dict]:
    """The curves figure's middle panel: its title and series. The accuracies where a run logs them, else its other
    val metrics (a multi-label run's mAP and F1), named as they are."""
    logged = {name: points for name, points in val.items() if name != "val_loss" and points}
    accuracies = {name: points for name, points in logged.items() if "acc" in name}
    if accuracies or not logged:
        return "validation accuracy", accuracies
    words = [name.removeprefix("val_").replace("_", " ").replace("map", "mAP") for name in logged]
    return "validation " + ", ".join(words), logged


def training_curves_figure(train_loss: Sequence[tuple[int, float]], val: dict[str, Sequence[tuple[int, float]]],
                           lr: Sequence[tuple[int, float]]) -> Figure:
    """A run's curves against the optimiser step: training loss (and val loss), val accuracy, learning rate.
    Each series is (step, value) pairs; ``val`` maps a metric name (val_loss, val_acc, ...) to its series."""
    fig = Figure(figsize=(13.0, 3.6))
    ax_loss, ax_acc, ax_lr = fig.subplots(1, 3)
    if train_loss:
        ax_loss.plot(*zip(*train_loss), lw=0.8, alpha=0.7, label="train_loss")
    if val.get("val_loss"):
        ax_loss.plot(*zip(*val["val_loss"]), "o-", ms=3, label="val_loss")
    ax_loss.set_title("loss")
    ax_loss.legend()
    title, metrics = validation_panel(val)
    for name, points in metrics.items():
        ax_acc.plot(*zip(*points), "o-", ms=3, label=name)
    if metrics:
        ax_acc.legend()
    else:
        ax_acc.text(0.5, 0.5, "no validation metric logged", ha="center", va="center", transform=ax_acc.transAxes)
    ax_acc.set_title(title)
    if lr:
        ax_lr.plot(*zip(*lr), lw=1.0)
    ax_lr.set_title("learning rate (head group)")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    for ax in (ax_loss, ax_acc, ax_lr):
        ax.set_xlabel("optimiser step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
