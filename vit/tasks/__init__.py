"""LightningModules: what to train (image classification, MAE pre-training, translation), and how to reload one."""

from __future__ import annotations

import os
from typing import Any, TypeVar

import torch

from vit.checkpoints.io import read_checkpoint
from vit.checkpoints.meta import expect_task
from vit.tasks.base import BaseTask, VisionTask
from vit.tasks.classify import ImageClassifier
from vit.tasks.convnet import ConvNetClassifier
from vit.tasks.pretrain import MaskedAutoencoder
from vit.tasks.translate import Translator

# checkpoint["vit"]["task"] -> the class that writes it
TASKS: dict[str, type[BaseTask]] = {cls.task: cls for cls in (ImageClassifier, MaskedAutoencoder, Translator)}
Task = TypeVar("Task", bound=BaseTask)


def load_task(path: str | os.PathLike, task_class: type[Task], map_location: str | torch.device = "cpu") -> Task:
    """Reload a task written by `vit fit` (e.g. ``load_task(path, Translator)``) in eval mode.

    The one way both tasks come back from a checkpoint: Lightning's ``load_from_checkpoint``, after a
    check that the file is whole and holds ``task_class`` (an error says what it holds instead).
    Pretrained weights are not fetched again: the checkpoint holds the trained ones.
    """
    expect_task(read_checkpoint(path, mmap=True), task_class.task, path)
    overrides: dict[str, Any] = {"pretrained": None} if task_class is ImageClassifier else {}
    task = task_class.load_from_checkpoint(path, map_location=map_location, weights_only=True, **overrides)
    return task.eval()


__all__ = ["TASKS", "BaseTask", "ConvNetClassifier", "ImageClassifier", "MaskedAutoencoder", "Translator", "VisionTask",
           "load_task"]
