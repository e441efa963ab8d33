"""Seeded splits of multi-label data that keep each label's share in every part: iterative stratification.

Sechidis, Tsoumakas and Vlahavas, "On the Stratification of Multi-Label Data" (ECML PKDD 2011), Algorithm 1: the
rarest label still to place goes first, each of its images to the part that wants most of that label (ties: the
part that wants most images, then the seed), and every label the image carries counts against that part's wants.
Single-label data keeps `vit.data.io.stratified_split`, which this reduces to in spirit, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def iterative_split(targets: np.ndarray, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    """Split the rows of ``targets`` ((N, C); 1 is a positive, 0 or -1 not) into [rest, part1, part2, ...] of
    ``fractions`` of the rows, each label's positives shared out in the same proportions; sorted indices.

    Every label with positives keeps one in the rest (training): a label no training image shows cannot be learnt.
    """
    positive = np.asarray(targets) > 0
    n, c = positive.shape
    ratios = np.array([1.0 - sum(fractions), *fractions])
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)  # the seed's order of the images within each label
    rows, cols = np.nonzero(positive[order])
    by_label = np.argsort(cols, kind="stable")
    starts = np.searchsorted(cols[by_label], np.arange(c + 1))
    members = [order[rows[by_label[starts[j]:starts[j + 1]]]] for j in range(c)]
    labels_of = np.split(cols, np.searchsorted(rows, np.arange(1, n)))  # nonzero() is row-major: rows ascend
    image_labels = [None] * n
    for k, i in enumerate(order):
        image_labels[i] = labels_of[k]
    remaining = positive.sum(0).astype(np.float64)
    wanted_label = ratios[:, None] * remaining[None, :]  # (parts, C)
    wanted = ratios * n  # (parts,)
    part = np.full(n, -1, dtype=np.int64)
    tie = rng.random(c) * 0.5  # ties between equally rare labels: by the seed
    while (remaining > 0).any():
        label = int(np.argmin(np.where(remaining > 0, remaining + tie, np.inf)))
        for i in members[label]:
            if part[i] >= 0:
                continue
            k = _best(wanted_label[:, label], wanted, rng)
            part[i] = k
            held = image_labels[i]
            wanted_label[k, held] -= 1
            remaining[held] -= 1
            wanted[k] -= 1
    for i in order[part[order] < 0]:  # images without a positive: to the parts that want most images
        k = _best(wanted, wanted, rng)
        part[i] = k
        wanted[k] -= 1
    _keep_one_for_training(part, members)
    return [np.flatnonzero(part == k) for k in range(len(ratios))]


def _best(primary: np.ndarray, secondary: np.ndarray, rng: np.random.Generator) -> int:
    """The part with the largest ``primary`` want, ties broken by ``secondary``, then at random."""
    best = np.flatnonzero(primary == primary.max())
    if len(best) > 1:
        best = best[secondary[best] == secondary[best].max()]
    return int(best[0] if len(best) == 1 else rng.choice(best))


def _keep_one_for_training(part: np.ndarray, members: list[np.ndarray]) -> None:
    """Move one image of every label the training part lacks (a label of one or two images) back into it."""
    for images in members:
        if len(images) and not (part[images] == 0).any():
            part[images[0]] = 0
