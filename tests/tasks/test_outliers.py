"""Composite outliers: images made of two classes' parts, with uniform targets (`vit.tasks.outliers`)."""

from __future__ import annotations

import pytest
import torch

from vit.errors import UserValueError
from vit.tasks.heads import SingleLabelHead
from vit.tasks.losses import SoftTargetCrossEntropy
from vit.tasks.outliers import CompositeOutliers, composites


def flat_batch(labels: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Image i is filled with the value i: a composite's pixels say which images it was cut from."""
    images = torch.arange(len(labels), dtype=torch.float32)[:, None, None, None].expand(-1, 1, 8, 8).clone()
    return images, torch.tensor(labels)


def test_each_composite_joins_two_images_of_different_labels_along_one_straight_cut():
    images, labels = flat_batch([0, 0, 1, 1, 2, 2, 3, 3])
    out = composites(images, labels, 8, torch.Generator().manual_seed(0))
    assert 1 <= len(out) <= 8
    for image in out[:, 0]:
        sources = image.unique().long().tolist()
        assert len(sources) == 2 and labels[sources[0]] != labels[sources[1]]
        rows, cols = (image == image[0, 0]).all(1), (image == image[0, 0]).all(0)
        # a horizontal cut: whole rows of one image then of the other (or the same along columns), 30-70% of 8
        cut = int(rows.sum()) if rows.any() else int(cols.sum())
        assert 2 <= cut <= 5


def test_no_composites_from_a_batch_of_one_label_and_at_most_count():
    images, labels = flat_batch([1] * 6)
    assert len(composites(images, labels, 3)) == 0
    images, labels = flat_batch([0, 1] * 6)
    assert len(composites(images, labels, 3)) == 3


def test_targets_one_hot_for_the_batch_and_uniform_for_the_composites():
    images, labels = flat_batch([0, 1, 2, 0, 1, 2, 0, 1])
    out, targets = CompositeOutliers(0.5, 3, smoothing=0.0)(images, labels)
    assert out.shape[0] == targets.shape[0] == 12 and torch.equal(out[:8], images)
    assert torch.equal(targets[:8], torch.eye(3)[labels])
    assert torch.allclose(targets[8:], torch.full((4, 3), 1 / 3))


def test_head_option_builds_the_mixer_and_the_soft_target_loss():
    head = SingleLabelHead(outlier_composites=0.25, label_smoothing=0.0)
    assert isinstance(head.mixer(4), CompositeOutliers) and isinstance(head.train_loss(4), SoftTargetCrossEntropy)
    assert SingleLabelHead().mixer(4) is None
    with pytest.raises(UserValueError, match="outlier_composites"):
        SingleLabelHead(outlier_composites=1.5).mixer(4)
