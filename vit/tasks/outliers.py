"""Synthetic near outliers for outlier exposure (Hendrycks et al. 2019) without an outlier set: a training image
whose one part comes from an image of another class, taught to spread its probability over every class.

    batch (B, C, H, W), labels (B,)
      -> pairs (i, j) of different labels -> composite = image i with the part of image j past a random cut
         (a horizontal or a vertical one, at 30%-70% of the side)                            (n, C, H, W)
      -> images cat composites (B + n, ...), targets cat uniform rows 1/K                     (B + n, K)

A part of one class and a part of another is what a near unknown often is to a model that has seen only the known
classes (a 9 is a 4's stem under a 0's loop), so the model learns to answer such images with low confidence and
features away from every class, which the "unknown" score reads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from vit.errors import UserValueError


def smoothed_onehot(labels: Tensor, num_classes: int, smoothing: float) -> Tensor:
    """One-hot targets (B, K) with label smoothing as torch's cross-entropy applies it."""
    off = smoothing / num_classes
    targets = torch.full((len(labels), num_classes), off, device=labels.device)
    return targets.scatter_(1, labels.long()[:, None], 1 - smoothing + off)


def composites(images: Tensor, labels: Tensor, count: int, generator: torch.Generator | None = None) -> Tensor:
    """Up to ``count`` images (n, C, H, W), each one image of the batch with the part past a random cut taken from
    an image of another label; none when the batch has one label only."""
    order = torch.randperm(len(images), generator=generator).to(images.device)
    partner = order.roll(1)
    keep = labels[order] != labels[partner]
    first, second = order[keep][:count], partner[keep][:count]
    out = images[first].clone()
    height, width = images.shape[-2:]
    for k in range(len(first)):
        along_rows = bool(torch.rand((), generator=generator) < 0.5)
        side = height if along_rows else width
        cut = int(side * (0.3 + 0.4 * float(torch.rand((), generator=generator))))
        if along_rows:  # the rows past the cut from the partner: top of one, bottom of the other
            out[k, :, cut:] = images[second[k], :, cut:]
        else:
            out[k, :, :, cut:] = images[second[k], :, :, cut:]
    return out


class CompositeOutliers:
    """(images, labels) -> (images with ``share`` x B composites appended, soft targets): the labels' (smoothed)
    one-hot rows, or an ``inner`` mixer's (mixup, cutmix), and a uniform row for each composite."""

    def __init__(self, share: float, num_classes: int, smoothing: float = 0.0,
                 inner: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None) -> None:
        if not 0 < share <= 1:
            raise UserValueError(f"outlier_composites must be in (0, 1] (the share of a batch added), got {share}")
        self.share, self.num_classes, self.smoothing, self.inner = share, num_classes, smoothing, inner

    def __call__(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        extra = composites(images, labels, max(1, round(self.share * len(images))))
        if self.inner is not None:
            images_out, targets = self.inner(images, labels)
        else:
            images_out, targets = images, smoothed_onehot(labels, self.num_classes, self.smoothing)
        uniform = torch.full((len(extra), self.num_classes), 1 / self.num_classes, device=targets.device,
                             dtype=targets.dtype)
        return torch.cat([images_out, extra]), torch.cat([targets, uniform])
