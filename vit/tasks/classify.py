"""Image classification with a VisionTransformer, as a LightningModule.

The module owns what training needs (loss, optimiser, schedule, EMA, metrics) and writes into the
checkpoint what prediction needs (model name and config, class names, image size, in_chans and the
normalisation mean/std), so `vit.deploy.load_classifier(path)` rebuilds a ready model without
the training config, and without Lightning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from vit.checkpoints.weights import load_pretrained
from vit.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from vit.errors import UserValueError
from vit.nn.vision import VisionTransformer
from vit.preprocessing import Prepared, Preprocessing
from vit.reports import save_confusion_matrix
from vit.tasks.base import VisionTask
from vit.tasks.distill import Teacher, check_options, hard_distillation, load_teacher, soft_distillation
from vit.tasks.finetune import apply_freezing, check_strategy, frozen_modules, unfreeze_epoch
from vit.tasks.losses import SoftTargetCrossEntropy
from vit.tasks.mistakes import ConfidentMistakes, log_figures, save_error_report
from vit.tasks.optim import (
    LambdaLR,
    adamw,
    describe_param_groups,
    global_batch,
    one_cycle,
    param_groups,
    per_epoch_steps,
    warmup_cosine,
)

log = logging.getLogger(__name__)


class ImageClassifier(Prepared, VisionTask):
    """A ViT classifier: label-smoothed CE (or mixup/cutmix soft targets), AdamW with layer decay,
    warm-up + cosine per step, optional EMA, torchmetrics accuracy and a test confusion matrix.

    Args:
        model: a name from ``vit.list_models()``.
        num_classes: number of classes (linked from the datamodule by the CLI).
        img_size: input side (linked from the datamodule); ``None`` keeps the named config's.
        in_chans: input channels (linked from the datamodule); ``None`` keeps the named config's.
        model_kwargs: other ``VisionTransformer`` overrides, e.g. ``{drop_path_rate: 0.1}``.
        pretrained: weights for ``vit.load_pretrained`` (a file or timm name); a new head is fine. Read by
            ``configure_model`` (which a Trainer calls), not by the constructor.
        class_names: names of the classes, stored in the checkpoint (linked from the datamodule).
        mean, std: normalisation the data used, stored in the checkpoint (linked from the datamodule);
            ``None``: ImageNet's for 3 channels, 0.5 otherwise.
        crop_pct: evaluation centre-crop fraction the data used, stored in the checkpoint (linked).
        interpolation: resize interpolation the data used, stored in the checkpoint (linked).
        lr: peak learning rate of the last layer group (the head), for a global batch of ``lr_base_batch``.
        lr_base_batch: when set, ``lr`` is scaled linearly to the real global batch (batch size x devices x
            nodes x gradient accumulation), as fine-tuning recipes quote it; ``None`` uses ``lr`` as given.
        weight_decay: AdamW decoupled weight decay (not applied to biases, norms and embeddings).
        betas: AdamW betas.
        warmup_epochs: linear warm-up length in epochs (fractions allowed).
        warmup_steps: warm-up length in optimiser steps; overrides ``warmup_epochs`` when set.
        min_lr: the cosine schedule's floor for the head group.
        schedule: "cosine": linear warm-up, then cosine down to ``min_lr`` (every published recipe here).
            "onecycle": torch's ``OneCycleLR``, as plain PyTorch loops often use it: cosine warm-up from
            lr/25, cosine down to lr/25e4, and AdamW's beta1 cycled 0.95 -> 0.85 -> 0.95 against the lr
            (``betas[0]`` and ``min_lr`` unused). From scratch on small folders it trains better in the same
            steps (scripts/experiments/parity.py). Not with ``finetune: staged``.
        layer_decay: layer-wise LR decay factor (e.g. 0.75 for fine-tuning); ``None`` = off.
        label_smoothing: label smoothing of the cross-entropy (also used by mixup's soft targets).
        mixup_alpha, cutmix_alpha: timm ``Mixup`` strengths; mixup is on when either is > 0.
        mixup_prob: probability of applying mixup or cutmix to a batch.
        mixup_switch_prob: probability of cutmix instead of mixup when both are on.
        ema_decay: decay of timm's ``ModelEmaV3`` (warmed up over the first steps); ``None`` = no EMA.
            Validation and test use it.
        finetune: what trains (`vit.tasks.finetune`): "full", "linear_probe", "partial" or "staged".
        freeze_blocks: "partial": the patch embedding and this many first blocks stay frozen.
        head_epochs: "staged": epochs that train the head alone before everything trains.
        class_weighting: weight the loss of each class by total / (classes x its training images),
            for imbalanced data (the counts come from the datamodule's training split).
        grad_checkpointing: recompute each block's activations in the backward pass instead of keeping them
            (``VisionTransformer.set_grad_checkpointing``): the same gradients, far less memory, about a third
            more compute per step. Under FSDP, use the strategy's ``activation_checkpointing_policy`` instead.
        compile: ``torch.compile`` the trained model (in place: checkpoints keep the same state-dict keys).
            Off by default: the first steps pay the compile, and on CPUs the gain is small; measure first.
        distillation: "hard" or "soft" (`vit.tasks.distill`): the student gets DeiT's dist token and second head,
            which learns from ``teacher``; inference uses the mean of the two heads. "none": no teacher.
        teacher: a `vit fit` checkpoint (any ViT family, or a timm convnet from configs/teacher_small.yaml), or "best"
            / "last" of ``teacher_dir``; with ``teacher_weights``, a timm model name. Read when fitting starts.
        teacher_weights: the weights of the timm model ``teacher`` names (.safetensors, .pth or a checkpoint).
        teacher_dir: the teacher run's checkpoint folder, where ``teacher: best`` looks.
        distill_alpha: the weight of the teacher's loss; 1 - alpha is the labels'.
        distill_tau: the softmax temperature of soft distillation.
    """

    task = "classify"

    def __init__(
        self,
        model: str = "vit_digits_patch2_8",
        num_classes: int = 10,
        img_size: int | None = None,
        in_chans: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        pretrained: str | None = None,
        class_names: list[str] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        crop_pct: float = 1.0,
        interpolation: str = "bicubic",
        lr: float = 1e-3,
        lr_base_batch: int | None = None,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_epochs: float = 0.0,
        warmup_steps: int | None = None,
        min_lr: float = 1e-6,
        schedule: str = "cosine",
        layer_decay: float | None = None,
        label_smoothing: float = 0.1,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mixup_prob: float = 1.0,
        mixup_switch_prob: float = 0.5,
        ema_decay: float | None = None,
        finetune: str = "full",
        freeze_blocks: int = 0,
        head_epochs: int = 0,
        class_weighting: bool = False,
        grad_checkpointing: bool = False,
        compile: bool = False,
        distillation: str = "none",
        teacher: str | None = None,
        teacher_weights: str | None = None,
        teacher_dir: str | None = None,
        distill_alpha: float = 0.5,
        distill_tau: float = 1.0,
    ) -> None:
        if num_classes < 1:
            raise UserValueError(f"num_classes must be at least 1, got {num_classes}")
        if class_names is not None and len(class_names) != num_classes:
            raise UserValueError(f"got {len(class_names)} class_names for num_classes={num_classes}")
        if schedule not in ("cosine", "onecycle"):
            raise UserValueError(f"schedule must be 'cosine' or 'onecycle', got {schedule!r}")
        if schedule == "onecycle" and finetune == "staged":
            raise UserValueError("schedule: onecycle has one warm-up; finetune: staged needs a second one when the "
                                 "backbone starts training: use schedule: cosine")
        check_options(distillation, distill_alpha, distill_tau)
        super().__init__()  # saves the arguments; configure_models, configure_losses, configure_metrics
        check_strategy(finetune, freeze_blocks, head_epochs, len(getattr(self.model, "blocks", ())))
        self.configure_preprocessing(class_names, mean, std, crop_pct, interpolation)

    # --- set-up ----------------------------------------------------------------------------
    def configure_models(self) -> None:
        """The ViT and its EMA copy, randomly initialised (Lightning's ``configure_model`` hook, below, loads
        the pretrained weights)."""
        hp = self.hparams
        distilled = {"distilled": True} if hp.distillation != "none" else {}  # the dist token and head_dist
        self.model: VisionTransformer = self.create_vit(hp.num_classes, **distilled)
        self.model.distilled_training = bool(distilled)  # training returns both heads' logits
        self.teacher: Teacher | None = None  # read in setup("fit")
        self.model.set_grad_checkpointing(hp.grad_checkpointing)
        # FSDP (use_orig_params) turns parameters into flat shards: the weight-decay rule needs their real ndim
        self.param_ndims = {name: p.ndim for name, p in self.model.named_parameters()}
        self.pretrained_loaded = False  # `configure_model` reads the weights: no I/O in the constructor
        self.model_ema = None
        if hp.ema_decay is not None:
            from timm.utils import ModelEmaV3

            # Warm-up: the decay grows with the step (1 - (1 + step)^-2/3, capped at ema_decay), so a short
            # run's EMA is not mostly its random initialisation.
            self.model_ema = ModelEmaV3(self.model, decay=hp.ema_decay, use_warmup=True)
            # The copy follows the weights by averaging, never by gradients: freeze it, or DDP
            # fails on parameters that require grad but take no part in the loss.
            self.model_ema.requires_grad_(False)
            # timm leaves the copy in eval mode; Lightning switches modes for val/test/predict anyway,
            # and a train-mode copy avoids its "modules in eval mode at the start of training" warning.
            self.model_ema.train()
        if hp.compile:
            # nn.Module.compile compiles forward in place, unlike torch.compile(model) which wraps the
            # model and renames every key "_orig_mod.*". After the EMA copy, which stays eager.
            self.model.compile()

    def configure_model(self) -> None:
        """Load the ``pretrained`` weights, once (Lightning calls this before every fit/validate/test/predict,
        and before restoring a checkpoint; call it yourself to use the model outside a Trainer).

        Here rather than in ``__init__``: a missing file or unreachable hub is then a plain error from the
        command, not a config-validation failure inside jsonargparse."""
        if self.pretrained_loaded or not self.hparams.pretrained:
            return
        load_pretrained(self.model, self.hparams.pretrained)
        if self.model_ema is not None:
            self.model_ema.set(self.model)  # the copy was made from the random initialisation
        self.pretrained_loaded = True

    def configure_preprocessing(
        self, class_names: Sequence[str] | None, mean: Sequence[float] | None, std: Sequence[float] | None,
        crop_pct: float, interpolation: str,
    ) -> None:
        """What the checkpoint records about the inputs: class names, normalisation, crop, interpolation."""
        self.class_names = list(class_names) if class_names else [str(i) for i in range(self.hparams.num_classes)]
        chans = self.model.in_chans
        if mean is None:
            mean = IMAGENET_MEAN if chans == 3 else (0.5,) * chans
        if std is None:
            std = IMAGENET_STD if chans == 3 else (0.5,) * chans
        if len(mean) != chans or len(std) != chans:
            raise UserValueError(f"mean {list(mean)} and std {list(std)} need one value per input channel ({chans})")
        self.preprocessing = Preprocessing(mean, std, crop_pct, interpolation)  # `mean` etc. read it

    def configure_losses(self, class_weights: Tensor | None = None) -> None:
        """Label-smoothed cross-entropy, or soft targets when mixup/cutmix is on; optionally class-weighted."""
        hp = self.hparams
        self.mixup = None
        if hp.mixup_alpha > 0 or hp.cutmix_alpha > 0:
            from timm.data import Mixup

            self.mixup = Mixup(
                mixup_alpha=hp.mixup_alpha, cutmix_alpha=hp.cutmix_alpha, prob=hp.mixup_prob,
                switch_prob=hp.mixup_switch_prob, label_smoothing=hp.label_smoothing, num_classes=hp.num_classes,
            )
            self.train_loss: nn.Module = SoftTargetCrossEntropy(class_weights)
        else:
            self.train_loss = nn.CrossEntropyLoss(weight=class_weights, label_smoothing=hp.label_smoothing)
        self.eval_loss = nn.CrossEntropyLoss()

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if stage == "fit" and hp.distillation != "none" and self.teacher is None:
            # Here, before Lightning moves the module to its device: the teacher follows it there, on every rank.
            self.teacher = load_teacher(hp.teacher, weights=hp.teacher_weights, folder=hp.teacher_dir,
                                        num_classes=hp.num_classes, in_chans=self.model.in_chans,
                                        class_names=self.class_names, mean=self.mean, std=self.std)
            rank_zero_info(f"distillation: {hp.distillation} (alpha {hp.distill_alpha}, tau {hp.distill_tau}) "
                           f"from the teacher {self.teacher.source}")
        if stage == "fit" and hp.class_weighting:
            counts = torch.tensor(self.trainer.datamodule.class_counts("train"), dtype=torch.float32)
            if (counts == 0).any():
                missing = [name for name, n in zip(self.class_names, counts.tolist()) if n == 0]
                raise UserValueError(f"class_weighting: classes without training images: {missing}")
            weights = counts.sum() / (len(counts) * counts)
            self.configure_losses(weights.to(self.device))
            rank_zero_info("class weights: " + ", ".join(f"{n} {w:.2f}" for n, w in zip(self.class_names, weights)))

    def configure_metrics(self) -> None:
        """One MetricCollection per stage: top-1, balanced accuracy (the mean of per-class recalls), top-5."""
        n = self.hparams.num_classes
        # "micro": the fraction of images classified right (torchmetrics defaults to a class mean).
        metrics = {"acc": MulticlassAccuracy(n, average="micro")}
        metrics["acc_balanced"] = MulticlassAccuracy(n, average="macro")
        if n >= 5:
            metrics["acc_top5"] = MulticlassAccuracy(n, top_k=5, average="micro")
        self.train_metrics = MetricCollection({"acc": MulticlassAccuracy(n, average="micro")}, prefix="train_")
        self.val_metrics = MetricCollection(metrics, prefix="val_")
        self.test_metrics = self.val_metrics.clone(prefix="test_")
        self.test_class_acc = MulticlassAccuracy(n, average=None)
        self.test_confusion = MulticlassConfusionMatrix(n)
        self.test_mistakes = ConfidentMistakes(16)  # errors.png: the most confident mistakes, with rollout

    # --- what prediction needs -------------------------------------------------------------
    @property
    def eval_model(self) -> VisionTransformer:
        """The weights used for validation, test and prediction: the EMA when it is on."""
        return self.model_ema.module if self.model_ema is not None else self.model

    def forward(self, x: Tensor) -> Tensor:
        """Logits (B, num_classes) of the evaluation weights."""
        return self.eval_model(x)

    # --- steps -----------------------------------------------------------------------------
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        self.check_images(x)
        if self.mixup is not None:
            if len(x) % 2:  # timm's Mixup pairs each sample with its mirror in the batch
                x, y = x[:-1], y[:-1]
            x_mixed, y_soft = self.mixup(x, y)
            loss = self.distill_loss(x_mixed, y_soft)[0]  # the teacher sees the same mixed images
        else:
            loss, logits = self.distill_loss(x, y)
            self.train_metrics.update(logits, y)
            self.log_dict(self.train_metrics, on_step=False, on_epoch=True)
        self.check_loss(loss)
        self.log("train_loss", loss, prog_bar=True)
        self.log("lr", self.optimizers().param_groups[-1]["lr"], prog_bar=False)
        return loss

    def distill_loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """(loss, logits) of the student on ``x``: the labels' loss, and the teacher's when distilling."""
        if self.teacher is None:
            logits = self.model(x)
            return self.train_loss(logits, y), logits
        cls, dist = self.model(x)
        base, teacher = self.train_loss(cls, y), self.teacher(x)
        hp = self.hparams
        if hp.distillation == "hard":
            loss = hard_distillation(base, dist, teacher, hp.distill_alpha)
        else:
            loss = soft_distillation(base, dist, teacher, hp.distill_alpha, hp.distill_tau)
        return loss, (cls + dist) / 2  # what inference answers

    def on_train_epoch_start(self) -> None:
        self.epoch_started = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        if self.teacher is not None:  # the teacher's share of the epoch, and of a step (teacher_ms in the logs)
            ms, line = self.teacher.report(time.perf_counter() - self.epoch_started)
            self.log("teacher_ms", ms, sync_dist=True)
            rank_zero_info(f"epoch {self.current_epoch}: {line}")

    # --- fine-tuning strategy ----------------------------------------------------------------
    def on_fit_start(self) -> None:
        hp = self.hparams
        ddp = self.trainer.strategy.model
        if hp.finetune != "full" and isinstance(ddp, DistributedDataParallel) and not ddp.find_unused_parameters:
            raise UserValueError(
                f"finetune: {hp.finetune} freezes parameters, which DDP only allows with find_unused_parameters: "
                "set trainer.strategy: ddp_find_unused_parameters_true"
            )
        rank_zero_info(self.param_group_table())

    def frozen_modules(self, epoch: int) -> list[nn.Module]:
        """The parts of the model that do not train in ``epoch`` under this run's strategy."""
        hp = self.hparams
        return frozen_modules(self.model, hp.finetune, hp.freeze_blocks, hp.head_epochs, epoch)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Every step, since validation and Lightning switch modules back to train mode.
        apply_freezing(self.model, self.frozen_modules(self.current_epoch))

    def param_group_table(self) -> str:
        """The optimiser's groups: name, parameters, peak lr, weight decay, and whether they train now."""
        frozen = [p for m in self.frozen_modules(self.current_epoch) for p in m.parameters()]
        return describe_param_groups(self.trainer.optimizers[0], frozen)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        # Here, not in on_train_batch_end: Lightning runs callbacks' on_train_batch_end first, so a mid-epoch
        # checkpoint (every_n_train_steps) would miss this step's update and a resumed run would drift from it.
        if self.model_ema is not None:
            self.model_ema.update(self.model, step=self.global_step)

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        x, y = batch
        logits = self(x)
        self.log(f"{stage}_loss", self.eval_loss(logits, y), prog_bar=stage == "val", sync_dist=True)
        metrics = self.val_metrics if stage == "val" else self.test_metrics
        metrics.update(logits, y)
        self.log_dict(metrics, prog_bar=True)
        return logits

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        logits = self._eval_step(batch, "test")
        self.test_class_acc.update(logits, batch[1])
        self.test_confusion.update(logits, batch[1])
        self.test_mistakes.update(batch[0], logits, batch[1])

    def on_test_epoch_end(self) -> None:
        confusion = self.test_confusion.compute().cpu()  # already global: torchmetrics syncs ranks on compute
        # A class without test images has no accuracy (torchmetrics says 0.0): NaN, left out and said.
        per_class = self.test_class_acc.compute().cpu().masked_fill(confusion.sum(1) == 0, float("nan"))
        for name, acc in zip(self.class_names, per_class.tolist()):
            if acc == acc:  # averaging equal values across ranks changes nothing, and tells Lightning it is synced
                self.log(f"test_acc_class/{name}", acc, sync_dist=True)
        if absent := [name for name, acc in zip(self.class_names, per_class.tolist()) if acc != acc]:
            rank_zero_info(f"no test images of {', '.join(map(repr, absent))}: no test accuracy for them")
        self.test_class_acc.reset()
        self.test_confusion.reset()
        self.last_confusion_matrix = confusion
        out_dir = self.trainer.log_dir  # the logger's run folder, else default_root_dir
        if out_dir is not None and self.trainer.is_global_zero:
            path = save_confusion_matrix(confusion, self.class_names, Path(out_dir) / "confusion_matrix.png")
            figures = save_error_report(self.eval_model, self.test_mistakes, per_class.tolist(), self.class_names,
                                        self.mean, self.std, out_dir)
            log_figures(self.trainer.loggers, figures, self.global_step)
            rank_zero_info(f"confusion matrix, per-class accuracy and most confident mistakes saved to {path.parent} "
                           "(confusion_matrix.png, class_accuracy.png, errors.png)")
        self.test_mistakes.reset()

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Class probabilities (B, num_classes); the batch is images or (images, anything)."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x).softmax(dim=-1)

    # --- optimiser -------------------------------------------------------------------------
    def peak_lr(self) -> float:
        """``lr``, scaled to the global batch when ``lr_base_batch`` is set; said once, on rank 0."""
        hp = self.hparams
        if hp.lr_base_batch is not None:
            return self.scaled_lr(hp.lr, hp.lr_base_batch, "lr", "lr_base_batch")
        images, parts = global_batch(self.trainer)
        rank_zero_info(f"effective lr {hp.lr:.4g} (as given: no lr_base_batch to scale it by); global batch "
                       f"{images} = {parts}")
        return hp.lr

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        lr = self.peak_lr()
        groups = param_groups(self.model, lr, hp.weight_decay, hp.layer_decay, ndims=self.param_ndims)
        optimizer = adamw(groups, lr=lr, betas=tuple(hp.betas))
        warmup, total = self.schedule_steps()
        if hp.schedule == "onecycle" and total >= 3:  # (1-2 steps, e.g. fast_dev_run: the cosine lambda below)
            scheduler = one_cycle(optimizer, warmup, total)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        min_ratio = self.min_lr_ratio(lr)
        schedule = lambda step: warmup_cosine(step, warmup, total, min_ratio)
        unfreeze = unfreeze_epoch(hp.finetune, hp.head_epochs)
        if unfreeze is None:
            lambdas = [schedule] * len(groups)
        else:  # staged: the backbone's groups warm up again from the epoch it starts training
            start = unfreeze * per_epoch_steps(self.trainer, total)
            rest = total - start
            backbone = lambda step: warmup_cosine(step - start, warmup, rest, min_ratio) if step >= start else 0.0
            lambdas = [schedule if g["name"].startswith("head_") else backbone for g in groups]
        scheduler = LambdaLR(optimizer, lambdas)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # --- checkpoint (checked on loading by VisionTask.on_load_checkpoint) ---------------------
    def checkpoint_meta(self) -> dict[str, Any]:
        """What `vit.deploy.load_classifier` needs besides the weights: task, model, classes, preparation."""
        return {
            "task": self.task,
            "model_name": self.model_name,
            "model_config": dict(self.model_config),
            "class_names": list(self.class_names),
            **self.preprocessing.to_dict(),  # mean, std, crop_pct, interpolation
            "ema": self.model_ema is not None,
            **({"teacher": self.teacher.source} if self.teacher is not None else {}),
        }

