"""`vit.tasks.losses.SoftTargetCrossEntropy` against torch's cross-entropy, which takes class probabilities too."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vit.tasks.losses import SoftTargetCrossEntropy


def test_soft_targets_give_torchs_cross_entropy_with_and_without_class_weights():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 4, generator=g)
    hard = torch.tensor([0, 1, 2, 3, 1, 1])
    soft = torch.rand(6, 4, generator=g).softmax(-1)
    torch.testing.assert_close(SoftTargetCrossEntropy()(logits, soft), F.cross_entropy(logits, soft))
    weights = torch.tensor([1.0, 0.5, 2.0, 4.0])
    # one-hot targets: torch's weighted mean over the samples' weights
    one_hot = F.one_hot(hard, 4).float()
    torch.testing.assert_close(SoftTargetCrossEntropy(weights)(logits, one_hot),
                               F.cross_entropy(logits, hard, weight=weights))
    # a mix: each sample weighs the weight of its target mix, the sum over those weights (a hand formula)
    per_sample = -(soft * weights * logits.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(SoftTargetCrossEntropy(weights)(logits, soft),
                               per_sample.sum() / (soft * weights).sum())
