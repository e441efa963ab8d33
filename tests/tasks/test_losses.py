"""`vit.tasks.losses` against independent computations: soft-target cross-entropy against torch's (which takes class
probabilities too), the masked multi-label BCE against the hand formula, the masked ASL against timm's."""

from __future__ import annotations

import pytest
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


def multi_label_case() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    logits = torch.randn(6, 4) * 2
    targets = (torch.rand(6, 4) < 0.4).float()
    targets[0, 1] = targets[3, 2] = targets[5, 0] = -1.0  # unknown
    return logits, targets


def test_masked_bce_is_the_hand_formula_over_the_known_labels_only():
    from vit.tasks.losses import MaskedBCEWithLogits

    logits, targets = multi_label_case()
    known = targets >= 0
    p, y = logits.sigmoid()[known], targets[known]
    w = torch.tensor([1.0, 3.0, 0.5, 2.0]).expand(6, 4)[known]
    by_hand = -(w * y * p.log() + (1 - y) * (1 - p).log()).mean()
    got = MaskedBCEWithLogits(pos_weight=torch.tensor([1.0, 3.0, 0.5, 2.0]))(logits, targets)
    assert got.item() == pytest.approx(by_hand.item(), rel=1e-5)
    # an unknown label's logit gets no gradient, whatever it is
    logits.requires_grad_(True)
    MaskedBCEWithLogits()(logits, targets).backward()
    assert logits.grad[~known].abs().max() == 0 and logits.grad[known].abs().min() > 0
    # smoothing s: 1 -> 1 - s/2, 0 -> s/2
    ys = y * 0.8 + 0.1
    smoothed = -(ys * p.log() + (1 - ys) * (1 - p).log()).mean()
    got = MaskedBCEWithLogits(smoothing=0.2)(logits.detach(), targets)
    assert got.item() == pytest.approx(smoothed.item(), rel=1e-5)


def test_masked_asymmetric_loss_is_timms_on_the_known_labels():
    from timm.loss import AsymmetricLossMultiLabel

    from vit.tasks.losses import MaskedAsymmetricLoss

    logits, targets = multi_label_case()
    known = targets >= 0
    # timm's loss is a sum of per-label terms: the known labels as one row, summed, over the 6 images
    timms = AsymmetricLossMultiLabel(gamma_neg=4, gamma_pos=1, clip=0.05, reduction="sum")(
        logits[known][None], targets[known][None]) / 6
    assert MaskedAsymmetricLoss()(logits, targets).item() == pytest.approx(timms.item(), rel=1e-5)
    assert MaskedAsymmetricLoss()(logits, targets.clamp(min=0)).item() != pytest.approx(timms.item(), rel=1e-3)


def test_logit_norm_is_cross_entropy_of_the_logits_over_tau_times_their_norm():
    from vit.tasks.losses import LogitNorm

    logits, labels = torch.randn(6, 4, generator=torch.Generator().manual_seed(0)) * 3, torch.tensor([0, 1, 2, 3, 0, 1])
    tau = 0.04
    # by hand: each row divided by tau times its Euclidean length, then torch's cross-entropy
    rows = logits / (tau * logits.pow(2).sum(1, keepdim=True).sqrt())
    expected = F.cross_entropy(rows, labels)
    assert torch.allclose(LogitNorm(torch.nn.CrossEntropyLoss(), tau)(logits, labels), expected, atol=1e-6)
    # the point of it: scaling the logits up no longer lowers the loss (plain cross-entropy's does)
    scaled = LogitNorm(torch.nn.CrossEntropyLoss(), tau)(10 * logits, labels)
    assert torch.allclose(scaled, expected, atol=1e-6)
    assert F.cross_entropy(10 * logits, labels) != pytest.approx(float(F.cross_entropy(logits, labels)))
