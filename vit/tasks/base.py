"""What the tasks share: set-up in three hooks, the training-step guards, and the checkpoint's record of its task.

A task reads top to bottom, in torchgeo's manner: its ``__init__`` checks the arguments a user can get wrong,
then ``BaseTask.__init__`` saves them as hyperparameters and calls, in this order,

    configure_models()    the networks (randomly initialised: no file is read in a constructor)
    configure_losses()    the training losses
    configure_metrics()   one MetricCollection per stage

``configure_models`` (plural) is this set-up hook; Lightning's own ``configure_model`` (singular) runs later,
inside a Trainer, and is where the classifier reads its pretrained weights.

``VisionTask`` adds what the two ViT tasks (classification, MAE pre-training) share: the named ViT, the
warm-up + cosine schedule's length, the lr scaled to the global batch, and the check that a checkpoint's ViT
is this run's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from vit.checkpoints.meta import META_KEY, expect_task
from vit.errors import UserValueError
from vit.nn.vision import MODEL_CONFIGS, VisionTransformer, ViTConfig, create_model
from vit.tasks.optim import global_batch, per_epoch_steps


class BaseTask(LightningModule):
    """A LightningModule that saves its arguments, sets itself up through three hooks, and writes its task
    (``checkpoint["vit"]["task"]``) into every checkpoint, which it checks again on loading."""

    task: ClassVar[str]  # what checkpoint["vit"]["task"] says: "classify", "pretrain" or "translate"
    planned_steps: int | None = None  # the optimiser steps this fit's lr schedule spans (`VisionTask.schedule_steps`)
    resumed_plan: int | None = None  # and those of the run whose checkpoint this one resumes

    def __init__(self) -> None:
        super().__init__()
        # Lightning collects the arguments of every __init__ on the way here: the subclass's, as given.
        self.save_hyperparameters()
        self.configure_models()
        self.configure_losses()
        self.configure_metrics()

    def configure_models(self) -> None:
        """Build the networks."""
        raise NotImplementedError

    def configure_losses(self) -> None:
        """Build the training losses (none: the loss is a function of the outputs)."""

    def configure_metrics(self) -> None:
        """Build the metrics (none by default)."""

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
    """A task around one named `VisionTransformer` (``self.model``), trained with AdamW, warm-up and cosine.

    Its hyperparameters include ``model``, ``img_size``, ``in_chans``, ``model_kwargs``, ``warmup_epochs``,
    ``warmup_steps`` and ``min_lr``.
    """

    def create_vit(self, num_classes: int, **extra: Any) -> VisionTransformer:
        """The named ViT with this run's sizes (``num_classes`` 0: an encoder, no head) and ``extra`` options; sets
        ``model_name`` and ``model_config``, the full config a checkpoint rebuilds the model from (`ViTConfig`)."""
        hp = self.hparams
        if hp.model not in MODEL_CONFIGS:
            raise UserValueError(f"unknown model {hp.model!r}; known models: {', '.join(sorted(MODEL_CONFIGS))}")
        overrides = dict(hp.model_kwargs or {}, num_classes=num_classes, **extra)
        if hp.img_size is not None:
            overrides["img_size"] = hp.img_size
        if hp.in_chans is not None:
            overrides["in_chans"] = hp.in_chans
        self.model_name: str = hp.model
        model = create_model(hp.model, **overrides)
        self.model_config: dict[str, Any] = model.config.to_dict()
        return model

    def check_images(self, images: Tensor) -> None:
        """Training images must arrive normalised: uint8 means the DataModule's device-side hook was skipped."""
        if images.dtype == torch.uint8:
            raise TypeError("training images arrived as uint8: they are normalised on the device by the "
                            "DataModule's on_after_batch_transfer; pass datamodule=... to Trainer.fit")

    # --- optimiser -------------------------------------------------------------------------------
    def scaled_lr(self, base_lr: float, base_batch: int, name: str, batch_name: str) -> float:
        """``base_lr`` x global batch (batch size x devices x nodes x gradient accumulation) / ``base_batch``,
        said once, on rank 0; ``name`` and ``batch_name`` say where the two numbers came from."""
        images, parts = global_batch(self.trainer)
        lr = base_lr * images / base_batch
        rank_zero_info(f"effective lr {lr:.4g} = {name} {base_lr:g} x global batch {images} / {batch_name} "
                       f"{base_batch}, the global batch being {parts}")
        return lr

    def schedule_steps(self) -> tuple[int, int]:
        """(warm-up, total) optimiser steps of this fit: ``warmup_steps``, else ``warmup_epochs`` x the steps of an
        epoch (gradient accumulation counted), at most the whole fit."""
        hp = self.hparams
        total = max(1, int(self.trainer.estimated_stepping_batches))
        if hp.warmup_steps is not None:
            warmup = hp.warmup_steps
        else:
            warmup = round(hp.warmup_epochs * per_epoch_steps(self.trainer, total))
        if self.resumed_plan not in (None, total):  # e.g. --trainer.max_epochs raised to train a finished run on
            rank_zero_info(f"the checkpoint's run planned its lr schedule over {self.resumed_plan:,} optimiser steps, "
                           f"this run over {total:,}: from the checkpoint's step on, the lr follows this run's")
        self.planned_steps = total
        return min(warmup, total), total

    def min_lr_ratio(self, lr: float) -> float:
        """``min_lr`` as a fraction of the peak ``lr``: the cosine's floor for the LambdaLR multiplier."""
        return min(1.0, self.hparams.min_lr / lr) if lr > 0 else 0.0

    # --- checkpoint ------------------------------------------------------------------------------
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Before any weight is copied: a checkpoint of another task, model or class count is a clear error."""
        super().on_load_checkpoint(checkpoint)
        meta = checkpoint[META_KEY]
        theirs, ours = ViTConfig.from_dict(meta["model_config"]).to_dict(), self.model_config  # defaults filled in
        differ = [f"{k}: checkpoint {theirs.get(k)!r}, this model {ours.get(k)!r}"
                  for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k)]
        if meta["model_name"] != self.model_name or differ:
            raise UserValueError(
                f"the checkpoint was written for {describe(meta['model_name'], theirs)}, this run builds "
                f"{describe(self.model_name, ours)}; they differ in {'; '.join(differ) or 'the model name'}"
            )


def describe(name: str, config: dict[str, Any]) -> str:
    """A ViT in a sentence: its name, and its classes when it has a head."""
    return f"{name} with {config.get('num_classes')} classes" if config.get("num_classes") else name


__all__ = ["BaseTask", "VisionTask"]
