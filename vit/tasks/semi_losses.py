"""FixMatch's unlabelled loss, with its confidence read from temperature-scaled probabilities, and FlexMatch's
per-class thresholds (Sohn et al., 2020; Zhang et al., 2021).

    weak view ─► logits_w ─► softmax(logits_w / T) ─► confidence, pseudo-label ─► mask = confidence ≥ τ_c
    strong view ─► logits_s ─► CE(logits_s, pseudo-label), kept where mask, averaged over all pool images

T is the temperature fit on the labelled validation images (`vit.deploy.calibration.fit_temperature`): a ViT
trained on 100 labels is over-confident, so a raw softmax passes τ = 0.95 on images it gets wrong. τ_c is τ
(FixMatch), or FlexMatch's τ·β_c, β_c = σ_c / max(max_c σ_c, unused), where σ_c counts the pool images last
predicted c above τ: a class the model rarely predicts confidently gets a lower bar, so it is learnt too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def pseudo_labels(weak_logits: Tensor, temperature: float, thresholds: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(pseudo-label (U,), confidence (U,), mask (U,) float) from the weak view's logits (U, C); ``thresholds``
    (C,) is each class's τ."""
    probabilities = torch.softmax(weak_logits.detach().float() / temperature, dim=-1)
    confidence, label = probabilities.max(dim=-1)
    return label, confidence, (confidence >= thresholds[label]).float()


def unlabelled_loss(strong_logits: Tensor, label: Tensor, mask: Tensor) -> Tensor:
    """Σ mask·CE(strong, pseudo-label) / U: FixMatch's mean over every pool image of the batch, masked or not."""
    return (F.cross_entropy(strong_logits.float(), label, reduction="none") * mask).mean()


def flexmatch_thresholds(predicted: Tensor, tau: float, num_classes: int) -> Tensor:
    """FlexMatch's τ·β_c (C,) from the class each pool image was last predicted above τ (-1: not yet, or not
    above τ), with the threshold warm-up: β_c = σ_c / max(max_c σ_c, number of -1)."""
    counts = torch.bincount(predicted[predicted >= 0], minlength=num_classes).float()
    unused = float((predicted < 0).sum())
    beta = counts / max(float(counts.max()), unused, 1.0)
    return tau * beta
