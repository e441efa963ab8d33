"""Seeded splits of multi-label data that keep each label's share in every part: iterative stratification.

Sechidis, Tsoumakas and Vlahavas, "On the Stratification of Multi-Label Data" (ECML PKDD 2011), Algorithm 1: the
rarest label still to place goes first, each of its images to the part that wants most of that label (ties: the
part that wants most images, then the seed), and every label the image carries counts against that part's wants.
A label's images are placed at once: water-filling the parts' wants gives each part the count the one-by-one rule
gives it (up to its ties), in blocks of the seed's order, and every label they carry is counted in one bincount.
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
    image_rows, image_cols = np.nonzero(positive)  # each image's labels (CSR, by image)
    indptr = np.searchsorted(image_rows, np.arange(n + 1))
    remaining = positive.sum(0).astype(np.float64)
    wanted_label = ratios[:, None] * remaining[None, :]  # (parts, C)
    wanted = ratios * n  # (parts,)
    part = np.full(n, -1, dtype=np.int64)
    tie = rng.random(c) * 0.5  # ties between equally rare labels: by the seed
    while (remaining > 0).any():
        label = int(np.argmin(np.where(remaining > 0, remaining + tie, np.inf)))
        todo = members[label][part[members[label]] < 0]
        # each image to the part that wants most of this label (ties: most images), one after another: as many
        # as water-filling the wants gives each part, in blocks of the seed's order
        counts = _fill(wanted_label[:, label], wanted, len(todo), rng)
        for k, block in enumerate(np.split(todo, np.cumsum(counts)[:-1])):
            part[block] = k
            held = np.bincount(image_cols[_gather(indptr, block)], minlength=c)
            wanted_label[k] -= held
            remaining -= held
            wanted[k] -= len(block)
        remaining[label] = 0  # (every image of it is placed now)
    rest = order[part[order] < 0]  # images without a positive: to the parts that want most images
    counts = _fill(wanted, wanted, len(rest), rng)
    for k, block in enumerate(np.split(rest, np.cumsum(counts)[:-1])):
        part[block] = k
    _keep_one_for_training(part, members)
    return [np.flatnonzero(part == k) for k in range(len(ratios))]


def _gather(indptr: np.ndarray, images: np.ndarray) -> np.ndarray:
    """The positions in the CSR arrays of every label of ``images``."""
    begin, length = indptr[images], indptr[images + 1] - indptr[images]
    offsets = np.repeat(begin - np.cumsum(length) + length, length)
    return np.arange(int(length.sum())) + offsets


def _fill(wants: np.ndarray, tiebreak: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """How many of ``m`` images each part takes when each in turn goes to the part wanting most (Sechidis's rule):
    the wants are water-filled down to a common level, and the last few go by the largest remaining want."""
    if m == 0:
        return np.zeros(len(wants), dtype=np.int64)
    top = np.sort(wants)[::-1]
    for j in range(1, len(top) + 1):  # the level L where the parts above it take sum(want - L) = m
        level = (top[:j].sum() - m) / j
        if j == len(top) or level >= top[j]:
            break
    counts = np.floor(np.maximum(wants - level, 0)).astype(np.int64)
    for _ in range(m - int(counts.sum())):  # fewer than the parts: one each to the largest remaining wants
        counts[_best(wants - counts, tiebreak - counts, rng)] += 1
    return counts


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
