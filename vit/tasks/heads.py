"""What a classifier's logits mean: the losses they train and are evaluated with, the metrics, and the answer.

A head is picked in the task's config (``model.init_args.head``) by its class, as LightningCLI picks any class:

    head:                                       # the default: single-label cross-entropy
      init_args: {label_smoothing: 0.1, mixup_alpha: 0.8, cutmix_alpha: 1.0}
    head:
      class_path: my_package.MyHead             # another kind of label: a subclass of ClassificationHead

A new kind of label (several labels per image, say) is a new subclass with its own loss, metrics and answer; the
task does not change. A head is a frozen dataclass of settings: it builds what it needs (losses, metrics, mixup)
for a number of classes, and holds no state of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from vit.errors import UserValueError
from vit.tasks.losses import SoftTargetCrossEntropy

# (images, labels) -> (images, targets): an augmentation that mixes labels along with images (mixup, cutmix)
TargetMixer = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


class ClassificationHead:
    """What a classifier's logits mean. Subclasses are frozen dataclasses of their settings."""

    picked_by_class: ClassVar[bool] = True  # a config names the class (`vit.tasks.base.as_config`)
    class_weighting: bool = False  # whether the task should count each class's training images (`class_weights`)

    def train_loss(self, num_classes: int, class_weights: Tensor | None = None) -> nn.Module:
        """The training loss of (logits, targets), targets as `mixer` leaves them."""
        raise NotImplementedError

    def eval_loss(self, num_classes: int) -> nn.Module:
        """The validation and test loss of (logits, labels)."""
        raise NotImplementedError

    def mixer(self, num_classes: int) -> TargetMixer | None:
        """What mixes a training batch's images and targets (mixup, cutmix), or None."""
        return None

    def metrics(self, num_classes: int) -> tuple[MetricCollection, MetricCollection]:
        """(training metrics, validation metrics) of (logits, labels), without prefixes."""
        raise NotImplementedError

    def class_weights(self, counts: Tensor, class_names: Sequence[str]) -> Tensor | None:
        """The loss weight of each class from its training-image counts, or None to weigh them alike."""
        return None

    def predict(self, logits: Tensor) -> Tensor:
        """What the classifier answers for logits (B, num_classes): class probabilities."""
        raise NotImplementedError


@dataclass(frozen=True)
class SingleLabelHead(ClassificationHead):
    """One label per image: label-smoothed cross-entropy (soft targets under mixup/cutmix), top-1, balanced and
    top-5 accuracy, softmax probabilities.

    Args:
        label_smoothing: label smoothing of the cross-entropy (also used by mixup's soft targets).
        mixup_alpha: timm ``Mixup``'s mixup strength; mixup is on when it or ``cutmix_alpha`` is > 0.
        cutmix_alpha: timm ``Mixup``'s cutmix strength.
        mixup_prob: probability of applying mixup or cutmix to a batch.
        mixup_switch_prob: probability of cutmix instead of mixup when both are on.
        class_weighting: weight the loss of each class by total / (classes x its training images), for
            imbalanced data (the counts come from the datamodule's training split).
    """

    label_smoothing: float = 0.1
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    class_weighting: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.label_smoothing < 1:
            raise UserValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")

    @property
    def mixes(self) -> bool:
        """Whether mixup or cutmix is on."""
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0

    def train_loss(self, num_classes: int, class_weights: Tensor | None = None) -> nn.Module:
        """Cross-entropy against mixup's soft targets, or label-smoothed against labels; optionally class-weighted."""
        if self.mixes:
            return SoftTargetCrossEntropy(class_weights)  # mixup's targets carry the smoothing
        return nn.CrossEntropyLoss(weight=class_weights, label_smoothing=self.label_smoothing)

    def eval_loss(self, num_classes: int) -> nn.Module:
        """Plain cross-entropy."""
        return nn.CrossEntropyLoss()

    def mixer(self, num_classes: int) -> TargetMixer | None:
        """timm's ``Mixup`` when mixup or cutmix is on (`EvenMixup`)."""
        if not self.mixes:
            return None
        from timm.data import Mixup

        return EvenMixup(Mixup(mixup_alpha=self.mixup_alpha, cutmix_alpha=self.cutmix_alpha, prob=self.mixup_prob,
                               switch_prob=self.mixup_switch_prob, label_smoothing=self.label_smoothing,
                               num_classes=num_classes))

    def metrics(self, num_classes: int) -> tuple[MetricCollection, MetricCollection]:
        """Training: top-1. Validation: top-1 ("micro": the fraction of images right), balanced accuracy (the mean
        of per-class recalls) and, from 5 classes, top-5."""
        n = num_classes
        val = {"acc": MulticlassAccuracy(n, average="micro"), "acc_balanced": MulticlassAccuracy(n, average="macro")}
        if n >= 5:
            val["acc_top5"] = MulticlassAccuracy(n, top_k=5, average="micro")
        return MetricCollection({"acc": MulticlassAccuracy(n, average="micro")}), MetricCollection(val)

    def class_weights(self, counts: Tensor, class_names: Sequence[str]) -> Tensor | None:
        """With ``class_weighting``: total / (classes x count), so each class weighs as much in the loss."""
        if not self.class_weighting:
            return None
        if (counts == 0).any():
            missing = [name for name, n in zip(class_names, counts.tolist()) if n == 0]
            raise UserValueError(f"class_weighting: classes without training images: {missing}")
        return counts.sum() / (len(counts) * counts)

    def predict(self, logits: Tensor) -> Tensor:
        """Softmax probabilities."""
        return logits.softmax(dim=-1)



class EvenMixup:
    """timm's ``Mixup`` on a batch of any size: it pairs each image with its mirror in the batch, so an odd batch
    loses its last image."""

    def __init__(self, mixup: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]) -> None:
        self.mixup = mixup

    def __call__(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        if len(images) % 2:
            images, labels = images[:-1], labels[:-1]
        return self.mixup(images, labels)


__all__ = ["ClassificationHead", "EvenMixup", "SingleLabelHead", "TargetMixer"]
