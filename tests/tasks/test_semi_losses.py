"""FixMatch's unlabelled loss and FlexMatch's thresholds against hand formulas (numpy, per image)."""

from __future__ import annotations

import math

import numpy as np
import torch

from vit.tasks.semi_losses import flexmatch_thresholds, pseudo_labels, unlabelled_loss


def test_the_mask_reads_temperature_scaled_probabilities_on_both_sides_of_the_threshold():
    weak = torch.tensor([[4.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    # softmax at T=1: 0.9643 and 0.7870; at T=2: 0.7870 and 0.5761
    for temperature, expected in ((1.0, [1.0, 0.0]), (2.0, [0.0, 0.0]), (0.5, [1.0, 1.0])):
        label, confidence, mask = pseudo_labels(weak, temperature, torch.full((3,), 0.95))
        p = np.exp(weak.numpy() / temperature)
        p /= p.sum(1, keepdims=True)
        np.testing.assert_allclose(confidence.numpy(), p.max(1), rtol=1e-6)
        assert mask.tolist() == expected and label.tolist() == [0, 0]
    at = pseudo_labels(weak[:1], 1.0, torch.zeros(3))[1][0]  # exp(4) / (exp(4) + 2), as float32 computes it
    assert abs(at.item() - math.exp(4) / (math.exp(4) + 2)) < 1e-6
    above = torch.nextafter(at, torch.tensor(1.0))
    assert pseudo_labels(weak[:1], 1.0, at.expand(3))[2].item() == 1.0  # exactly at the threshold: kept (>=)
    assert pseudo_labels(weak[:1], 1.0, above.expand(3))[2].item() == 0.0


def test_per_class_thresholds_apply_to_the_pseudo_labels_class():
    weak = torch.tensor([[3.0, 0.0], [0.0, 3.0]])  # both 0.9526 confident, of classes 0 and 1
    _, _, mask = pseudo_labels(weak, 1.0, torch.tensor([0.99, 0.5]))
    assert mask.tolist() == [0.0, 1.0]


def test_the_unlabelled_loss_is_the_masked_cross_entropy_over_every_pool_image():
    strong = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    label, mask = torch.tensor([0, 1, 2, 3, 0]), torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])
    s = strong.numpy().astype(np.float64)
    ce = np.log(np.exp(s).sum(1)) - s[np.arange(5), label.numpy()]
    expected = (ce * mask.numpy()).sum() / 5  # divided by all 5, not the 3 kept
    assert abs(unlabelled_loss(strong, label, mask).item() - expected) < 1e-6


def test_flexmatch_thresholds_scale_with_each_class_learning_effect():
    predicted = torch.tensor([0, 0, 0, 0, 1, 1, 2, -1])  # sigma = 4, 2, 1; 1 unused
    np.testing.assert_allclose(flexmatch_thresholds(predicted, 0.9, 4).numpy(), [0.9, 0.45, 0.225, 0.0],
                               rtol=1e-6)
    warm = torch.tensor([0, 1, -1, -1, -1, -1])  # more unused than any class: the warm-up divides by the unused
    np.testing.assert_allclose(flexmatch_thresholds(warm, 0.9, 2).numpy(), [0.9 / 4, 0.9 / 4], rtol=1e-6)
