"""What a classifier's logits mean: the losses they train and are evaluated with, the metrics, and the answer.

A head is picked in the task's config (``model.init_args.head``) by its class, as LightningCLI picks any class:

    head:                                       # the default: single-label cross-entropy
      init_args: {label_smoothing: 0.1, mixup_alpha: 0.8, cutmix_alpha: 1.0}
    head:
      class_path: my_package.MyHead             # another kind of label: a subclass of ClassificationHead

    head:
      class_path: vit.tasks.heads.MultiLabelHead  # several labels per image (picked for multi-label data)
      init_args: {loss: asl}

A new kind of label is a new subclass with its own loss, metrics, evaluation and answer; the task does not change.
A head is a frozen dataclass of settings: it builds what it needs (losses, metrics, mixup, its validation and test
`evaluation`) for a number of classes, and holds no state of its own.

The kind of label is one word, ``label_kind`` ("single" or "multi"): each head says which it is for, and `vit fit`
links the data's kind to the classifier's ``label_kind`` argument, which `head_for` reads (the default head becomes
the data's kind's). Checkpoints written before the word say ``multi_label`` (`vit.tasks.compat`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MultilabelF1Score

from vit.errors import UserValueError
from vit.tasks.evaluation import Evaluation
from vit.tasks.losses import LogitNorm, MaskedAsymmetricLoss, MaskedBCEWithLogits, SoftTargetCrossEntropy
from vit.tasks.mistakes import SingleLabelEvaluation
from vit.tasks.multilabel import MultiLabelEvaluation, MultiLabelMixup

# (images, labels) -> (images, targets): an augmentation that mixes labels along with images (mixup, cutmix)
TargetMixer = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
# The kinds of label: one per image, or several (targets (B, C) of 1/0/-1)
SINGLE, MULTI = "single", "multi"
LABEL_KINDS = (SINGLE, MULTI)


class ClassificationHead:
    """What a classifier's logits mean. Subclasses are frozen dataclasses of their settings."""

    picked_by_class: ClassVar[bool] = True  # a config names the class (`vit.tasks.base.as_config`)
    label_kind: ClassVar[str] = SINGLE  # the data it is for: one of `LABEL_KINDS`
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

    def evaluation(self, num_classes: int) -> Evaluation:
        """What validation and test measure (`vit.tasks.evaluation`): by default, one label per image's (the
        `metrics`' validation half per stage, and the test's per-class accuracy, confusion matrix and mistakes)."""
        return SingleLabelEvaluation(self.metrics(num_classes)[1], num_classes)

    def class_weights(self, counts: Tensor, class_names: Sequence[str]) -> Tensor | None:
        """The loss weight of each class from its training-image counts, or None to weigh them alike."""
        return None

    def training_counts(self, datamodule: Any) -> Tensor:
        """What `class_weights` counts: the training images of each class (the DataModule's ``class_counts``)."""
        return torch.tensor(datamodule.class_counts("train"), dtype=torch.float32)

    def predict(self, logits: Tensor) -> Tensor:
        """What the classifier answers for logits (B, num_classes): class probabilities."""
        raise NotImplementedError

    def metric_inputs(self, logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """What the training metrics are updated with: (logits, labels) as they are."""
        return logits, targets


@dataclass(frozen=True)
class MixingHead(ClassificationHead):
    """The settings every built-in head takes: label smoothing, mixup and cutmix, and class weighting (each head
    says what they mean for its labels).

    Args:
        label_smoothing: label smoothing of the loss (and of mixup's soft targets).
        mixup_alpha: mixup's strength; mixup is on when it or ``cutmix_alpha`` is > 0.
        cutmix_alpha: cutmix's strength.
        mixup_prob: probability of applying mixup or cutmix to a batch.
        mixup_switch_prob: probability of cutmix instead of mixup when both are on.
        class_weighting: weigh the loss of rare classes up (counted in the datamodule's training split).
    """

    label_smoothing: float = 0.0
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


@dataclass(frozen=True)
class SingleLabelHead(MixingHead):
    """One label per image: label-smoothed cross-entropy (soft targets under mixup/cutmix), top-1, balanced and
    top-5 accuracy, softmax probabilities.

    Args (`MixingHead`'s, as they act here):
        label_smoothing: of the cross-entropy, 0.1 by default (also used by mixup's soft targets).
        mixup_alpha, cutmix_alpha, mixup_prob, mixup_switch_prob: timm ``Mixup``'s.
        class_weighting: weight the loss of each class by total / (classes x its training images), for
            imbalanced data (the counts come from the datamodule's training split).
        logit_norm: > 0: the training loss on logits / (logit_norm |logits|) (LogitNorm, Wei et al. 2022; 0.04
            there); 0: off.
        outlier_composites: > 0: add this share of a batch as images made of two classes' parts, taught to
            answer every class alike (`vit.tasks.outliers`: outlier exposure without an outlier set); 0: off.
    """

    label_smoothing: float = 0.1  # the ViT recipes' (DeiT's) default, where `MixingHead`'s is 0
    logit_norm: float = 0.0
    outlier_composites: float = 0.0

    def train_loss(self, num_classes: int, class_weights: Tensor | None = None) -> nn.Module:
        """Cross-entropy against mixup's soft targets, or label-smoothed against labels; optionally class-weighted,
        optionally on LogitNorm's normalised logits."""
        if self.logit_norm < 0:
            raise UserValueError(f"logit_norm must be >= 0 (0: off), got {self.logit_norm}")
        if self.mixes or self.outlier_composites:
            loss = SoftTargetCrossEntropy(class_weights)  # the mixer's targets carry the smoothing
        else:
            loss = nn.CrossEntropyLoss(weight=class_weights, label_smoothing=self.label_smoothing)
        return LogitNorm(loss, self.logit_norm) if self.logit_norm else loss

    def eval_loss(self, num_classes: int) -> nn.Module:
        """Plain cross-entropy."""
        return nn.CrossEntropyLoss()

    def mixer(self, num_classes: int) -> TargetMixer | None:
        """timm's ``Mixup`` when mixup or cutmix is on (`EvenMixup`), and the composite outliers after it when on."""
        mixup = None
        if self.mixes:
            from timm.data import Mixup

            mixup = EvenMixup(Mixup(mixup_alpha=self.mixup_alpha, cutmix_alpha=self.cutmix_alpha,
                                    prob=self.mixup_prob, switch_prob=self.mixup_switch_prob,
                                    label_smoothing=self.label_smoothing, num_classes=num_classes))
        if not self.outlier_composites:
            return mixup
        from vit.tasks.outliers import CompositeOutliers

        return CompositeOutliers(self.outlier_composites, num_classes, self.label_smoothing, mixup)

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


@dataclass(frozen=True)
class MultiLabelHead(MixingHead):
    """Several labels per image (targets (B, C): 1, 0, or -1 for unknown): a sigmoid per class, binary
    cross-entropy (or timm's asymmetric loss) over the known labels, macro mAP, and per-class thresholds chosen on
    val (`vit.tasks.multilabel`). The classifier picks it when its data is multi-label (``label_kind: multi``).

    Args:
        loss: "bce" (binary cross-entropy with logits, the mean over the known labels) or "asl" (timm's
            ``AsymmetricLossMultiLabel``: easy negatives count less, for many labels with few positives each).
        asl_gamma_neg, asl_gamma_pos, asl_clip: the asymmetric loss's focusing and negative shift (timm's defaults).
        label_smoothing: each label is its own yes/no question: a target 1 becomes 1 - s/2 and a 0 becomes s/2
            (not the single-label s/C spread over the classes). Off by default.
        mixup_alpha, cutmix_alpha, mixup_prob, mixup_switch_prob: as `SingleLabelHead`'s; the targets are mixed as
            the images are (lam x own + (1 - lam) x other), and a label unknown in either image stays unknown.
        class_weighting: weigh each class's positives by its negatives / positives in the training split
            (``pos_weight``), at most ``max_pos_weight``, for rare labels.
        max_pos_weight: the cap of those weights.
        min_positives: a class with fewer known positives in val keeps the threshold 0.5 (too rare to tune).
    """

    label_kind: ClassVar[str] = MULTI
    loss: str = "bce"
    asl_gamma_neg: float = 4.0
    asl_gamma_pos: float = 1.0
    asl_clip: float = 0.05
    max_pos_weight: float = 100.0
    min_positives: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss not in ("bce", "asl"):
            raise UserValueError(f"head.init_args.loss must be 'bce' or 'asl', got {self.loss!r}")

    def train_loss(self, num_classes: int, class_weights: Tensor | None = None) -> nn.Module:
        """BCE or ASL over the known labels, with ``class_weights`` as each class's positive weight."""
        if self.loss == "asl":
            return MaskedAsymmetricLoss(self.asl_gamma_neg, self.asl_gamma_pos, self.asl_clip, class_weights,
                                        self.label_smoothing)
        return MaskedBCEWithLogits(class_weights, self.label_smoothing)

    def eval_loss(self, num_classes: int) -> nn.Module:
        """Plain BCE over the known labels."""
        return MaskedBCEWithLogits()

    def mixer(self, num_classes: int) -> TargetMixer | None:
        """`MultiLabelMixup` when mixup or cutmix is on."""
        if not self.mixes:
            return None
        return MultiLabelMixup(self.mixup_alpha, self.cutmix_alpha, self.mixup_prob, self.mixup_switch_prob)

    def metrics(self, num_classes: int) -> tuple[MetricCollection, MetricCollection]:
        """Training: micro F1 at 0.5. Validation and test: computed on every image at once
        (`vit.tasks.multilabel.LabelScores`), so none here."""
        f1 = MultilabelF1Score(num_classes, average="micro", ignore_index=-1)
        return MetricCollection({"f1": f1}), MetricCollection({})

    def evaluation(self, num_classes: int) -> Evaluation:
        """Every image's scores at once, the thresholds chosen on val, mAP and F1 (`MultiLabelEvaluation`)."""
        return MultiLabelEvaluation(num_classes, self.min_positives)

    def class_weights(self, counts: Tensor, class_names: Sequence[str]) -> Tensor | None:
        """With ``class_weighting``: negatives / positives per class (``counts``: (2, C), positives and known
        labels), capped at ``max_pos_weight``."""
        if not self.class_weighting:
            return None
        positives, known = counts
        if (positives == 0).any():
            missing = [name for name, n in zip(class_names, positives.tolist()) if n == 0]
            raise UserValueError(f"class_weighting: labels without a positive training image: {missing}")
        return ((known - positives) / positives).clamp(max=self.max_pos_weight)

    def training_counts(self, datamodule: Any) -> Tensor:
        """(2, C): each class's positives and known labels in the training split (its dataset's ``labels``, the
        (N, C) targets)."""
        labels = torch.as_tensor(datamodule.train_set.labels)
        return torch.stack([(labels == 1).sum(0), (labels >= 0).sum(0)]).float()

    def predict(self, logits: Tensor) -> Tensor:
        """A sigmoid per class."""
        return logits.sigmoid()

    def metric_inputs(self, logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Probabilities (torchmetrics would take logits in [0, 1] for probabilities) and integer labels."""
        return logits.detach().sigmoid(), targets.long()


def head_for(head: ClassificationHead, label_kind: str | None) -> ClassificationHead:
    """The head for data of ``label_kind`` ("single", "multi"; None: as the head says): the default single-label
    head becomes the default `MultiLabelHead`; a head set for the other kind of data is an error that says so."""
    if label_kind not in (None, *LABEL_KINDS):
        raise UserValueError(f"label_kind must be one of {', '.join(LABEL_KINDS)} (or null), got {label_kind!r}")
    if label_kind is None or label_kind == head.label_kind:
        return head
    if label_kind == MULTI and head == SingleLabelHead():
        return MultiLabelHead()
    if label_kind == MULTI:
        raise UserValueError(f"the data has several labels per image, but the head is {head}: set "
                             "model.init_args.head.class_path: vit.tasks.heads.MultiLabelHead (it takes "
                             "label_smoothing, mixup and class_weighting too)")
    raise UserValueError(f"the head is {type(head).__name__}, for several labels per image, but the data has one "
                         "label per image: drop model.init_args.head, or give a multi-label labels file")


def data_label_kind(multi_label: bool | None) -> str | None:
    """The label kind of a DataModule's ``multi_label`` (what `vit fit` links to the classifier's ``label_kind``)."""
    return None if multi_label is None else MULTI if multi_label else SINGLE


class EvenMixup:
    """timm's ``Mixup`` on a batch of any size: it pairs each image with its mirror in the batch, so an odd batch
    loses its last image."""

    def __init__(self, mixup: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]) -> None:
        self.mixup = mixup

    def __call__(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        if len(images) % 2:
            images, labels = images[:-1], labels[:-1]
        return self.mixup(images, labels)


__all__ = ["LABEL_KINDS", "ClassificationHead", "EvenMixup", "MixingHead", "MultiLabelHead", "SingleLabelHead",
           "TargetMixer", "data_label_kind", "head_for"]
