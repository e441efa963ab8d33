"""Losses beyond torch's own: the image classifier's soft targets, and the contrastive losses of two towers
(`vit.tasks.contrastive`)."""

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
