"""Losses beyond torch's own: the image classifier's soft targets (mixup), the multi-label losses that leave
unknown labels (-1) out, and the contrastive losses of two towers (`vit.tasks.contrastive`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class SoftTargetCrossEntropy(nn.Module):
    """Cross-entropy against soft targets (mixup/cutmix), as timm's, with optional class weights.

    With weights, each sample counts by the weight of its target mix, and the mean is over those
    weights, as ``nn.CrossEntropyLoss(weight=...)`` does for hard labels.
    """

    def __init__(self, class_weights: Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("class_weights", class_weights, persistent=False)

    def forward(self, logits: Tensor, targets: Tensor) -> Tensor:
        losses = -(targets * logits.log_softmax(dim=-1))  # (B, classes)
        if self.class_weights is None:
            return losses.sum(dim=-1).mean()
        weighted = losses * self.class_weights
        return weighted.sum() / (targets * self.class_weights).sum()


class LogitNorm(nn.Module):
    """A loss of logits taken on logits / (tau |logits|) (LogitNorm, Wei et al. 2022): the norm of the logits can no
    longer grow to lower the loss, which keeps the confidence of images unlike the training set lower."""

    def __init__(self, loss: nn.Module, tau: float) -> None:
        super().__init__()
        self.loss, self.tau = loss, tau

    def forward(self, logits: Tensor, targets: Tensor) -> Tensor:
        norms = logits.float().norm(dim=-1, keepdim=True).clamp_min(1e-7)  # (B, 1)
        return self.loss(logits / (self.tau * norms), targets)


def smoothed(targets: Tensor, smoothing: float) -> Tensor:
    """Multi-label smoothing: each label is its own yes/no question, so a target t becomes t(1 - s) + s/2 (1 ->
    1 - s/2, 0 -> s/2), as timm's ``AsymmetricLossMultiLabel(smoothing=s)`` does; unknown (-1) stays unknown."""
    if not smoothing:
        return targets
    return torch.where(targets < 0, targets, targets * (1 - smoothing) + smoothing / 2)


class MaskedBCEWithLogits(nn.Module):
    """Binary cross-entropy of each label, averaged over the known ones: a target of -1 (unknown) adds nothing to
    the loss nor to the count it is divided by. ``pos_weight`` (C,) weighs each class's positives (rare labels)."""

    def __init__(self, pos_weight: Tensor | None = None, smoothing: float = 0.0) -> None:
        super().__init__()
        self.smoothing = smoothing
        self.register_buffer("pos_weight", pos_weight, persistent=False)

    def forward(self, logits: Tensor, targets: Tensor) -> Tensor:
        known = (targets >= 0).to(logits.dtype)  # (B, C)
        y = smoothed(targets, self.smoothing).clamp(min=0)
        losses = F.binary_cross_entropy_with_logits(logits, y.to(logits.dtype), pos_weight=self.pos_weight,
                                                    reduction="none")
        return (losses * known).sum() / known.sum().clamp(min=1)


class MaskedAsymmetricLoss(nn.Module):
    """timm's ``AsymmetricLossMultiLabel`` (Ridnik et al., 2021: easy negatives down-weighted by (p)^gamma_neg and
    shifted by ``clip``), with unknown labels (-1) masked out; summed over the labels, averaged over the images,
    as timm's ``batchmean``."""

    def __init__(self, gamma_neg: float = 4.0, gamma_pos: float = 1.0, clip: float = 0.05,
                 pos_weight: Tensor | None = None, smoothing: float = 0.0) -> None:
        super().__init__()
        from timm.loss import AsymmetricLossMultiLabel

        self.smoothing = smoothing
        self.asl = AsymmetricLossMultiLabel(gamma_neg=gamma_neg, gamma_pos=gamma_pos, clip=clip, reduction="none",
                                            pos_weight=pos_weight)

    def forward(self, logits: Tensor, targets: Tensor) -> Tensor:
        known = (targets >= 0).to(logits.dtype)
        y = smoothed(targets, self.smoothing).clamp(min=0)  # smoothed here, where the mask is known
        return (self.asl(logits, y) * known).sum() / len(logits)


def clip_loss(image: Tensor, text: Tensor, scale: Tensor) -> Tensor:
    """CLIP's InfoNCE: the mean of the image->text and text->image cross-entropies of ``scale`` x cosines, pair i
    of the batch the right answer of row i. ``image``, ``text``: unit-length embeddings (B, E); ``scale``: the
    multiplier itself (exp of the model's logit_scale)."""
    logits = scale * image @ text.T  # (B, B): images x texts
    labels = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def siglip_loss(image: Tensor, text: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    """SigLIP's sigmoid loss: every image-text pair of the batch a binary question (+1 on the diagonal, -1 off it)
    on ``scale`` x cosine + ``bias``; summed over the pairs, divided by the batch (Zhai et al. 2023)."""
    logits = scale * image @ text.T + bias  # (B, B)
    signs = 2 * torch.eye(logits.shape[0], device=logits.device, dtype=logits.dtype) - 1
    return -F.logsigmoid(signs * logits).sum() / logits.shape[0]
