"""What the tasks share: set-up in three hooks, the training-step guards, and the checkpoint's record of its task.

A task reads top to bottom, in torchgeo's manner: its ``__init__`` checks the arguments a user can get wrong,
then ``BaseTask.__init__`` saves them as hyperparameters and calls, in this order,

    configure_models()    the networks (randomly initialised: no file is read in a constructor)
    configure_losses()    the training losses
    configure_metrics()   one MetricCollection per stage

``configure_models`` (plural) is this set-up hook; Lightning's own ``configure_model`` (singular) runs later,
inside a Trainer, and is where the classifier reads its pretrained weights.

``BaseTask`` also says, once for every task, how a batch unpacks into inputs and targets (`unpack`) and how long
this fit's lr schedule is (`schedule_steps`, which a resumed run re-plans), and keeps hyperparameters that are
settings objects (`vit.tasks.optim.Optimization`, a `vit.tasks.heads` head) as a config file writes them, so a
checkpoint's hyperparameters stay plain data.

``VisionTask`` adds what the image tasks (classification, MAE pre-training) share: the named network, the lr
scaled to the global batch, and the check that a checkpoint's network is this run's.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from vit.checkpoints.io import read_checkpoint
from vit.checkpoints.meta import META_KEY, expect_task
from vit.errors import UserValueError
from vit.nn.vision import VisionTransformer
from vit.tasks.backbones import ViTBackbone
from vit.tasks.optim import global_batch, per_epoch_steps

Part = TypeVar("Part")


class BaseTask(LightningModule):
    """A LightningModule that saves its arguments, sets itself up through three hooks, and writes its task
    (``checkpoint["vit"]["task"]``) into every checkpoint, which it checks again on loading."""

    task: ClassVar[str]  # what checkpoint["vit"]["task"] says: a key of vit.checkpoints.meta.TASK_CLASSES
    planned_steps: int | None = None  # the optimiser steps this fit's lr schedule spans (`VisionTask.schedule_steps`)
    resumed_plan: int | None = None  # and those of the run whose checkpoint this one resumes

    def __init__(self) -> None:
        super().__init__()
        # Lightning collects the arguments of every __init__ on the way here: the subclass's, as given.
        self.save_hyperparameters()
        for key, value in self.hparams.items():  # settings objects as a config holds them: plain data
            self.hparams[key] = as_config(value)
        self.configure_models()
        self.configure_losses()
        self.configure_metrics()

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """Lightning's, after a check that the file holds this task: another task's hyperparameters would build this
        one (and fail on arguments it never took) before ``on_load_checkpoint`` could say what the file holds."""
        if isinstance(checkpoint_path, (str, os.PathLike)) and Path(checkpoint_path).is_file():
            expect_task(read_checkpoint(checkpoint_path, mmap=True), cls.task, "the checkpoint")
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def configure_models(self) -> None:
        """Build the networks."""
        raise NotImplementedError

    def configure_losses(self) -> None:
        """Build the training losses (none: the loss is a function of the outputs)."""

    def configure_metrics(self) -> None:
        """Build the metrics (none by default)."""

    # --- batches and the training step's guard ---------------------------------------------------
    @staticmethod
    def unpack(batch: Any) -> tuple[Any, Any]:
        """(inputs, targets) of a batch: (images, labels) from an image DataModule, or images alone (targets
        None). A task whose batches differ (`Translator`'s dicts) says so here."""
        if isinstance(batch, (tuple, list)):
            return batch[0], batch[1] if len(batch) > 1 else None
        return batch, None

    # --- the training step's guard -------------------------------------------------------------
    def check_loss(self, loss: Tensor) -> None:
        """A non-finite loss stops the run before the optimiser step, so no checkpoint holds the broken weights."""
        if not torch.isfinite(loss):
            lr = self.optimizers().param_groups[-1]["lr"]  # the head's, where groups differ
            raise FloatingPointError(
                f"loss is {loss.item()} at step {self.global_step} (lr {lr:.3g}, precision {self.trainer.precision}); "
                "lower the lr, clip gradients or check the inputs. "
                "The last checkpoint holds the weights from before this step."
            )

    # --- the lr schedule's length ------------------------------------------------------------------
    def schedule_steps(self, warmup_epochs: float, warmup_steps: int | None) -> tuple[int, int]:
        """(warm-up, total) optimiser steps of this fit: ``warmup_steps``, else ``warmup_epochs`` x the steps of an
        epoch (gradient accumulation counted), at most the whole fit."""
        total = max(1, int(self.trainer.estimated_stepping_batches))
        if warmup_steps is not None:
            warmup = warmup_steps
        else:
            warmup = round(warmup_epochs * per_epoch_steps(self.trainer, total))
        if self.resumed_plan not in (None, total):  # e.g. --trainer.max_epochs raised to train a finished run on
            rank_zero_info(f"the checkpoint's run planned its lr schedule over {self.resumed_plan:,} optimiser steps, "
                           f"this run over {total:,}: from the checkpoint's step on, the lr follows this run's")
        self.planned_steps = total
        return min(warmup, total), total

    @staticmethod
    def min_lr_ratio(min_lr: float, lr: float) -> float:
        """``min_lr`` as a fraction of the peak ``lr``: the cosine's floor for the LambdaLR multiplier."""
        return min(1.0, min_lr / lr) if lr > 0 else 0.0

    # --- checkpoint ----------------------------------------------------------------------------
    def checkpoint_meta(self) -> dict[str, Any]:
        """What the checkpoint says about itself (``checkpoint["vit"]``): at least the task."""
        return {"task": self.task}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[META_KEY] = self.checkpoint_meta()
        if self.planned_steps is not None:
            checkpoint[META_KEY]["schedule_steps"] = self.planned_steps

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Before any weight is copied: a checkpoint of another task is a clear error."""
        expect_task(checkpoint, self.task, "the checkpoint")
        self.resumed_plan = checkpoint[META_KEY].get("schedule_steps")


class VisionTask(BaseTask):
    """A task around one named image network (``self.model``), trained with AdamW, warm-up and cosine.

    Its hyperparameters include ``model``, ``img_size``, ``in_chans`` and ``model_kwargs``. ``backbone`` (a
    `vit.tasks.backbones.Backbone`) builds and describes the network: our ViT unless a task picks another.
    """

    backbone = ViTBackbone()

    def create_vit(self, num_classes: int, **extra: Any) -> VisionTransformer:
        """The named network with this run's sizes (``num_classes`` 0: an encoder, no head) and ``extra`` options;
        sets ``model_name`` and ``model_config``, the full config a checkpoint rebuilds it from (`ViTConfig`)."""
        hp = self.hparams
        options = dict(hp.model_kwargs or {}, **extra)
        model, self.model_config = self.backbone.build(hp.model, num_classes, hp.img_size, hp.in_chans, options)
        self.model_name: str = hp.model
        return model

    def check_images(self, images: Tensor) -> None:
        """Training images must arrive normalised: uint8 means the DataModule's device-side hook was skipped."""
        if images.dtype == torch.uint8:
            raise TypeError("training images arrived as uint8: they are normalised on the device by the "
                            "DataModule's on_after_batch_transfer; pass datamodule=... to Trainer.fit")

    # --- optimiser -------------------------------------------------------------------------------
    def scaled_lr(self, base_lr: float, base_batch: int | None, name: str, batch_name: str) -> float:
        """``base_lr`` x global batch (batch size x devices x nodes x gradient accumulation) / ``base_batch``
        (``base_lr`` as given when ``base_batch`` is None), said once, on rank 0; ``name`` and ``batch_name`` say
        where the two numbers came from."""
        images, parts = global_batch(self.trainer)
        if base_batch is None:
            rank_zero_info(f"effective lr {base_lr:.4g} (as given: no {batch_name} to scale it by); global batch "
                           f"{images} = {parts}")
            return base_lr
        lr = base_lr * images / base_batch
        rank_zero_info(f"effective lr {lr:.4g} = {name} {base_lr:g} x global batch {images} / {batch_name} "
                       f"{base_batch}, the global batch being {parts}")
        return lr

    # --- checkpoint ------------------------------------------------------------------------------
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Before any weight is copied: a checkpoint of another task, model or class count is a clear error."""
        super().on_load_checkpoint(checkpoint)
        self.backbone.check_checkpoint(checkpoint[META_KEY], self.model_name, self.model_config)


def as_config(value: Any) -> Any:
    """A hyperparameter as a config file holds it: a settings dataclass as its fields, and a class a config picks
    among subclasses (a head) as ``{class_path, init_args}``; anything else as it is."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value
    fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if getattr(type(value), "picked_by_class", False):
        return {"class_path": f"{type(value).__module__}.{type(value).__qualname__}", "init_args": fields}
    return fields


def from_config(value: Any, base: type[Part], default: Part) -> Part:
    """A settings object from what `as_config` wrote (or itself, or ``default`` for None): a checkpoint's
    hyperparameters rebuild the task without LightningCLI. A ``class_path`` must name a subclass of ``base``."""
    if value is None:
        return default
    if isinstance(value, base):
        return value
    if not isinstance(value, Mapping):
        raise UserValueError(f"expected a {base.__name__} or its settings, got {value!r}")
    if "class_path" not in value:
        return type(default)(**value)
    module, _, name = str(value["class_path"]).rpartition(".")
    cls = getattr(importlib.import_module(module), name, None) if module else None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise UserValueError(f"{value['class_path']!r} is not a {base.__module__}.{base.__name__}")
    return cls(**(value.get("init_args") or {}))


__all__ = ["BaseTask", "VisionTask", "as_config", "from_config"]
