"""What a classifier's validation and test measure, owned by the kind of label it trains (the head builds it).

    head.evaluation(num_classes) -> Evaluation (an nn.Module child of the task: its metrics follow the device)
        start(stage, loaders)                  an epoch begins (how a DistributedSampler split the data)
        step(stage, images, logits, targets)   a batch: the metrics to log now (Lightning reduces them per epoch)
        end(stage, run)                        the epoch's values to log, and the test report and figures
        checkpoint_meta() / load_meta(meta)    what it writes into checkpoint["vit"] (multi-label: thresholds)

    single label: `vit.tasks.mistakes.SingleLabelEvaluation`   accuracy, per class, confusion matrix, mistakes
    multi-label:  `vit.tasks.multilabel.MultiLabelEvaluation`  every image's scores, thresholds chosen on val, mAP

`ImageClassifier` calls these hooks unconditionally and never asks which kind of label it trains. A new kind of label
is a head and its evaluation; the task does not change.

Why a head that evaluates and not a subclass per label kind (torchgeo's ``MultiLabelClassificationTask``): the label
kind is already a part the config picks (``model.init_args.head``), and `vit fit` picks it from the data (the
DataModule's kind is linked to the task's ``label_kind``) where no link can pick the model's class; a subclass
per kind would double every other classifier subclass (distillation, and the semi-supervised tasks to come); and
the checkpoints of either kind already name ``vit.tasks.ImageClassifier``.

An evaluation sees the run through `Run`, a few plain values, not the LightningModule: what it reads is stated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn


@dataclass(frozen=True)
class Run:
    """What an evaluation's epoch end needs of the task and its trainer.

    Args:
        class_names: the classes, in the order of the logits.
        mean, std: the normalisation the images went through (the figures undo it).
        model: the evaluated network (the mistakes' attention rollout).
        out_dir: the run folder figures are written to (the trainer's ``log_dir``); None: no figures.
        is_global_zero: whether this process is rank 0, the one that draws.
        loggers: the trainer's loggers (TensorBoard and W&B get the figures as images).
        step: the global step the figures are logged at.
        counted: False for Lightning's sanity-check pass, on which nothing is chosen (thresholds).
    """

    class_names: Sequence[str]
    mean: Sequence[float]
    std: Sequence[float]
    model: nn.Module | None = None
    out_dir: str | None = None
    is_global_zero: bool = True
    loggers: Sequence[Any] = field(default_factory=tuple)
    step: int = 0
    counted: bool = True


class Evaluation(nn.Module):
    """The hooks a classifier's validation and test call (stage: "val" or "test"); subclasses own the metrics."""

    def start(self, stage: str, loaders: Any) -> None:
        """At an epoch's start, with the trainer's loaders of ``stage``."""

    def step(self, stage: str, images: Tensor, logits: Tensor, targets: Tensor) -> Mapping[str, Any]:
        """Take a batch; what to log now (values or torchmetrics the logger reduces over the epoch)."""
        raise NotImplementedError

    def end(self, stage: str, run: Run) -> dict[str, float]:
        """At an epoch's end: its values to log (already global across processes), and any report of ``run``."""
        return {}

    def checkpoint_meta(self) -> dict[str, Any]:
        """What this label kind adds to ``checkpoint["vit"]`` (`vit.checkpoints.meta.label_meta`)."""
        return {}

    def load_meta(self, meta: Mapping[str, Any]) -> None:
        """Take back what `checkpoint_meta` wrote, from a checkpoint being loaded."""


__all__ = ["Evaluation", "Run"]
