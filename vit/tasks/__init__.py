"""LightningModules: what to train (image classification, MAE pre-training, translation), and how to reload one."""

from __future__ import annotations

import os
from typing import Any, TypeVar

import torch
from lightning.pytorch import LightningModule

from vit.checkpoint import read_checkpoint, task_of
from vit.errors import UserValueError
from vit.tasks.classify import ImageClassifier
from vit.tasks.pretrain import MaskedAutoencoder
from vit.tasks.translate import Translator

TASKS: dict[str, type[LightningModule]] = {
    "classify": ImageClassifier, "pretrain": MaskedAutoencoder, "translate": Translator,
}
Task = TypeVar("Task", bound=LightningModule)


def load_task(path: str | os.PathLike, task_class: type[Task], map_location: str | torch.device = "cpu") -> Task:
    """Reload a task written by `vit fit` (e.g. ``load_task(path, Translator)``) in eval mode.

    The one way both tasks come back from a checkpoint: Lightning's ``load_from_checkpoint``, after a
    check that the file is whole and holds ``task_class`` (an error says what it holds instead).
    Pretrained weights are not fetched again: the checkpoint holds the trained ones.
    """
    found = task_of(read_checkpoint(path, mmap=True))
    if TASKS.get(found) is not task_class:
        what = f"the {TASKS[found].__name__} task" if found in TASKS else "no `vit fit` task"
        raise UserValueError(f"{path}: expected a checkpoint of the {task_class.__name__} task, but it holds {what}")
    overrides: dict[str, Any] = {"pretrained": None} if task_class is ImageClassifier else {}
    task = task_class.load_from_checkpoint(path, map_location=map_location, weights_only=True, **overrides)
    return task.eval()


__all__ = ["TASKS", "ImageClassifier", "MaskedAutoencoder", "Translator", "load_task"]
