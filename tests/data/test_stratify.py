"""Iterative stratification (vit.data.stratify): every label's share kept in each part, checked by counting, against
a plain seeded random split of the same rows."""

from __future__ import annotations

import numpy as np
import pytest

from vit.data.stratify import iterative_split


def tags(n: int = 3000, seed: int = 0) -> np.ndarray:
    """(n, 12) multi-hot rows: labels from 1% to 40% common, some co-occurring, some rows with no label, unknowns."""
    rng = np.random.default_rng(seed)
    rates = np.geomspace(0.01, 0.4, 12)
    targets = (rng.random((n, 12)) < rates).astype(np.int8)
    targets[:, 1] |= targets[:, 0]  # a rare label that always comes with another
    targets[rng.random((n, 12)) < 0.05] = -1  # unknown: not a positive
    return targets


def worst_share_error(targets: np.ndarray, parts: list[np.ndarray], fractions: list[float]) -> float:
    """The largest gap, over labels and parts, between a part's positives of a label and its share of them."""
    positives = (targets > 0).sum(0)
    wanted = [1 - sum(fractions), *fractions]
    return max(np.abs((targets[p] > 0).sum(0) - w * positives).max() for p, w in zip(parts, wanted))


def test_each_label_keeps_its_share_in_every_part_far_closer_than_a_random_split():
    targets = tags()
    parts = iterative_split(targets, [0.1, 0.1], seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(targets)))  # a partition
    assert [len(p) for p in parts] == pytest.approx([2400, 300, 300], abs=15)
    ours = worst_share_error(targets, parts, [0.1, 0.1])
    rng = np.random.default_rng(0)
    order = rng.permutation(len(targets))
    random_parts = [order[600:], order[:300], order[300:600]]
    assert ours <= 1.5 and worst_share_error(targets, random_parts, [0.1, 0.1]) > 3 * ours


def test_seeded_the_same_split_again_and_another_seed_another_split():
    targets = tags(500)
    one, again, other = (iterative_split(targets, [0.2], seed=s) for s in (0, 0, 1))
    assert all(np.array_equal(a, b) for a, b in zip(one, again))
    assert not np.array_equal(one[1], other[1])


@pytest.mark.parametrize(("fractions", "train_size"), [([0.25, 0.25], 20), ([0.45, 0.45], 4 + 2)])
def test_a_label_of_one_or_two_images_keeps_one_for_training(fractions, train_size):
    """At 0.25/0.25 the split itself leaves training one image of each rare label; at 0.45/0.45 (training wants
    10%) it sends them all to val and test on every seed, and the guard moves exactly one of each back: training
    holds its 40 x share plus the images moved, and no image of a label it already has."""
    targets = np.zeros((40, 3), dtype=np.int8)
    targets[:, 0] = 1
    targets[5, 1] = 1  # one image
    targets[[7, 9], 2] = 1  # two images
    for seed in range(10):
        parts = iterative_split(targets, fractions, seed=seed)
        assert sorted(np.concatenate(parts).tolist()) == list(range(40))  # still a partition
        train_counts = (targets[parts[0]] > 0).sum(0)
        assert train_counts[1] == 1 and train_counts[2] == 1, (seed, train_counts)
        assert len(parts[0]) == train_size, (seed, [len(p) for p in parts])
