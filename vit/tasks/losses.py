"""Losses of the image classifier beyond torch's own."""

from __future__ import annotations

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
