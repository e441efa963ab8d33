"""LightningModules: what to train (image classification, MAE pre-training, translation, CLIP/SigLIP contrastive
pre-training), and how to reload one.

    base.py         what the tasks share: set-up hooks, the training-step guards, the checkpoint's task record
    classify.py     `ImageClassifier`, a loop over its parts:
    backbones.py      the network (our ViTs or timm's)
    heads.py          what the logits mean: losses and answer; losses.py: the losses beyond torch's; outliers.py:
                      outlier exposure on composites of two classes' parts (near unknowns);
    evaluation.py     the label kind's evaluation, built by its head: metrics, thresholds, test report
    multilabel.py     several labels per image; mistakes.py: the single-label evaluation and its figures
    optim.py          the optimisation settings, parameter groups, schedule; ema.py: the EMA copy
    finetune.py       which parts train, epoch by epoch: Full, LinearProbe, Partial, Staged, Adapters (LoRA/DoRA)
    compat.py         older spellings of the classifier's arguments, read the new way with a warning
    distill.py      `DistilledClassifier`: a student and its teacher; function_matching.py: `FunctionMatching`, a
                    student that matches its teacher on labelled and unlabelled images (`vit.data.pool`)
    semi.py         `FixMatch`: semi-supervised on the pool, confidence from calibrated probabilities (semi_losses.py)
    convnet.py      0.1's `ConvNetClassifier` (deprecated: `backbone: timm`)
    contrastive.py  both towers of a CLIP/SigLIP on image-caption pairs
    pretrain.py     `MaskedAutoencoder`: MAE pre-training
    translate.py    `Translator`: the text Transformer; text_metrics.py: chrF as sacrebleu counts it"""

from __future__ import annotations

import os
from typing import TypeVar

import torch

from vit.checkpoints.io import read_checkpoint
from vit.checkpoints.meta import TASK_CLASSES, expect_task
from vit.errors import UserValueError
from vit.tasks.base import BaseTask, VisionTask
from vit.tasks.classify import ImageClassifier
from vit.tasks.compat import upgraded_hparams
from vit.tasks.contrastive import ContrastiveTask
from vit.tasks.convnet import ConvNetClassifier
from vit.tasks.distill import DistilledClassifier
from vit.tasks.function_matching import FunctionMatching
from vit.tasks.heads import ClassificationHead, SingleLabelHead
from vit.tasks.optim import Optimization
from vit.tasks.pretrain import MaskedAutoencoder
from vit.tasks.semi import FixMatch
from vit.tasks.translate import Translator

# checkpoint["vit"]["task"] -> the class that writes it: the checkpoints' registry (`TASK_CLASSES`), imported
TASKS: dict[str, type[BaseTask]] = {task: globals()[entry.class_name] for task, entry in TASK_CLASSES.items()}
Task = TypeVar("Task", bound=BaseTask)


def load_task(path: str | os.PathLike, task_class: type[Task], map_location: str | torch.device = "cpu") -> Task:
    """Reload a task written by `vit fit` (e.g. ``load_task(path, Translator)``) in eval mode.

    The one way both tasks come back from a checkpoint: Lightning's ``load_from_checkpoint``, after a
    check that the file is whole and holds ``task_class`` (an error says what it holds instead).
    Pretrained weights are not fetched again: the checkpoint holds the trained ones. A classifier written by 0.1
    (flat ``lr``, ``label_smoothing``, ...) comes back with those settings as its ``optim`` and ``head``.
    """
    checkpoint = read_checkpoint(path, mmap=True)
    meta = expect_task(checkpoint, task_class.task, path)
    if not issubclass(task_class, ImageClassifier):
        return task_class.load_from_checkpoint(path, map_location=map_location, weights_only=True).eval()
    hparams = checkpoint.get("hyper_parameters") or {}
    upgraded = upgraded_hparams(hparams, meta)
    if upgraded is None:
        task = task_class.load_from_checkpoint(path, map_location=map_location, weights_only=True, pretrained=None)
        return task.eval()
    if "distillation" in upgraded and not issubclass(task_class, DistilledClassifier):
        raise UserValueError(f"{path} was written by a distilling run of vit 0.1: load_task(path, "
                             "vit.tasks.DistilledClassifier) reads it (vit.deploy.load_classifier too)")
    task = task_class(**{**upgraded, "pretrained": None})
    task.on_load_checkpoint(checkpoint)  # the task and the network checked before any weight is copied
    task.load_state_dict(checkpoint["state_dict"])
    return task.to(map_location).eval()


__all__ = ["TASKS", "BaseTask", "ClassificationHead", "ContrastiveTask", "ConvNetClassifier", "DistilledClassifier",
           "FixMatch", "FunctionMatching", "ImageClassifier", "MaskedAutoencoder", "Optimization", "SingleLabelHead",
           "Translator", "VisionTask", "load_task"]
