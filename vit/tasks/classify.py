"""Image classification, as a LightningModule with pluggable parts: the network (``backbone``: our ViTs, or a timm
model: `vit.tasks.backbones`), what the labels mean (``head``: the losses, metrics and answer, `vit.tasks.heads`)
and how it trains (``optim``: AdamW, schedule, layer decay, EMA, `vit.tasks.optim.Optimization`). Distillation from
a teacher is a subclass (`vit.tasks.distill.DistilledClassifier`).

The module writes into the checkpoint what prediction needs (model name and config, class names, image size,
in_chans and the normalisation mean/std), so `vit.deploy.load_classifier(path)` rebuilds a ready model without
the training config, and without Lightning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from vit._graveyard import moved_name
from vit.checkpoints.meta import META_KEY, classify_meta
from vit.errors import UserValueError
from vit.preprocessing import Prepared, Preprocessing
from vit.tasks import compat
from vit.tasks.backbones import backbone_named
from vit.tasks.base import VisionTask, as_config, from_config
from vit.tasks.ema import check_ema_sharding, ema_copy
from vit.tasks.evaluation import Run
from vit.tasks.finetune import FineTuning, Frozen, Full, Staged, apply_freezing
from vit.tasks.heads import ClassificationHead, SingleLabelHead, head_for
from vit.tasks.optim import (
    Optimization,
    adamw,
    group_schedules,
    network_group_table,
    one_cycle,
    param_groups,
    per_epoch_steps,
    step_schedule,
)

log = logging.getLogger(__name__)


class ImageClassifier(Prepared, VisionTask):
    """An image classifier: a backbone's logits, a head's loss and metrics, AdamW with layer decay, warm-up + cosine
    per step, optional EMA, a test confusion matrix and error report.

    Args:
        model: the network's name: one of ``vit.list_models()`` (``backbone: vit``) or ``timm.list_models()``.
        num_classes: number of classes (linked from the datamodule by the CLI).
        img_size: input side (linked from the datamodule); ``None`` keeps the named config's.
        in_chans: input channels (linked from the datamodule); ``None`` keeps the named config's.
        model_kwargs: the network's other options: ``VisionTransformer`` overrides (e.g. ``{drop_path_rate: 0.1}``),
            or ``timm.create_model`` arguments.
        pretrained: weights to start from (a file or a tag), read by ``configure_model`` (which a Trainer calls),
            not by the constructor; a new head is fine.
        backbone: what builds the network (`vit.tasks.backbones`): "vit" (ours, every family), "timm", or the
            import path of a ``Backbone`` subclass.
        head: what the labels mean (`vit.tasks.heads`): the losses, metrics, evaluation and answer. The default,
            single-label cross-entropy, takes ``label_smoothing``, mixup/cutmix and ``class_weighting``:
            ``head: {init_args: {mixup_alpha: 0.8}}``.
        optim: how it trains (`vit.tasks.optim.Optimization`): ``lr``, ``lr_base_batch``, ``weight_decay``,
            ``betas``, ``warmup_epochs``/``warmup_steps``, ``min_lr``, ``schedule``, ``layer_decay``, ``ema_decay``.
        finetune: what trains, epoch by epoch (`vit.tasks.finetune`): ``Full``, ``LinearProbe``,
            ``Partial(freeze_blocks)``, ``Staged(head_epochs)``, or ``Adapters(rank, ..., dora)`` on a frozen base:
            ``finetune: {class_path: vit.tasks.finetune.Staged, init_args: {head_epochs: 2}}``.
        grad_checkpointing: recompute each block's activations in the backward pass instead of keeping them
            (``set_grad_checkpointing``): the same gradients, far less memory, about a third more compute per
            step. Under FSDP, use the strategy's ``activation_checkpointing_policy`` instead.
        compile: ``torch.compile`` the trained model (in place: checkpoints keep the same state-dict keys).
            Off by default: the first steps pay the compile, and on CPUs the gain is small; measure first.
        class_names: names of the classes, stored in the checkpoint (linked from the datamodule).
        label_kind: "single" or "multi" label per image (linked from the datamodule): "multi" makes the default
            head `vit.tasks.heads.MultiLabelHead`; ``None`` follows the head.
        preprocessing: how the data prepared its images (`vit.preprocessing.Preprocessing`: mean, std, crop_pct,
            interpolation), stored in the checkpoint (linked from the datamodule); ``None``: ImageNet's mean and std
            for 3 channels (0.5 otherwise), no crop, bicubic.
        head_init: "random", or "zeroshot": the head starts as the class names' text embeddings from the
            ``pretrained`` CLIP/SigLIP (a tag, file or folder `vit zeroshot` reads, or a `vit.tasks.ContrastiveTask`
            checkpoint), the image tower as its weights (LP-FT's start). ``model_kwargs`` must give its image
            tower's architecture (``proj_dim``, ``normalize_embedding: true``, ...); any ``finetune`` mode.
            "zeroshot:TEMPLATES" names its prompt templates (a named set, or a file of one a line with ``{}`` for
            the class name); plain "zeroshot" takes the family's default.
    """

    task = "classify"
    moved: ClassVar[dict[str, str]] = compat.MOVED
    test_tta: str = "none"  # the test's TTA: "flip" where `vit fit --calibrate` measured it better on val
    old_spellings = staticmethod(compat.upgraded_arguments)  # what `vit fit`'s parser reads the new way, with a warning

    def __init__(
        self,
        model: str = "vit_digits_patch2_8",
        num_classes: int = 10,
        img_size: int | None = None,
        in_chans: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        pretrained: str | None = None,
        backbone: str = "vit",
        head: ClassificationHead = SingleLabelHead(),  # noqa: B008 (frozen: one instance serves every call)
        optim: Optimization = Optimization(),  # noqa: B008
        finetune: FineTuning = Full(),  # noqa: B008
        grad_checkpointing: bool = False,
        compile: bool = False,
        class_names: list[str] | None = None,
        label_kind: str | None = None,
        preprocessing: Preprocessing | None = None,
        head_init: str = "random",
        **old: Any,  # the old spellings `vit.tasks.compat` reads (finetune's settings, mean, ...), with a warning
    ) -> None:
        if num_classes < 1:
            raise UserValueError(f"num_classes must be at least 1, got {num_classes}")
        if class_names is not None and len(class_names) != num_classes:
            raise UserValueError(f"got {len(class_names)} class_names for num_classes={num_classes}")
        check_head_init(head_init, pretrained, backbone)
        super().__init__()  # saves the arguments; configure_models, configure_losses, configure_metrics
        self.finetune.check(self.roles.depth)
        if self.optim.schedule == "onecycle" and isinstance(self.finetune, Staged):
            raise UserValueError("optim.schedule: onecycle has one warm-up; finetune: Staged needs a second one when "
                                 "the backbone starts training: use optim.schedule: cosine")
        self.configure_preprocessing(class_names, self.hparams.preprocessing)

    # --- set-up ----------------------------------------------------------------------------
    def configure_models(self) -> None:
        """The parts the hyperparameters name (backbone, head, optim, finetune), the network and its EMA copy,
        randomly initialised (Lightning's ``configure_model`` hook, below, loads the pretrained weights)."""
        hp = self.hparams
        compat.read_old_spellings(hp, type(self))  # finetune: lora, mean, ...: read the new way, with a warning
        self.backbone = backbone_named(hp.backbone)
        self.head: ClassificationHead = head_for(from_config(hp.head, ClassificationHead, SingleLabelHead()),
                                                 hp.label_kind)
        self.optim: Optimization = from_config(hp.optim, Optimization, Optimization())
        self.model: nn.Module = self.build_network()
        self.roles = self.backbone.roles(self.model)  # stem, tokens, blocks, pool, head: `vit.nn.roles`
        self.finetune: FineTuning = from_config(hp.finetune, FineTuning, Full())
        self.finetune.attach(self.model, self.roles)  # adapters: on the network, the base frozen for good
        self.register_load_state_dict_post_hook(self.finetune.base_left_out)  # a thin checkpoint's missing base
        self.model.set_grad_checkpointing(hp.grad_checkpointing)
        # FSDP (use_orig_params) turns parameters into flat shards: the decay rule and group table need real shapes
        self.param_shapes = {name: tuple(p.shape) for name, p in self.model.named_parameters()}
        self.pretrained_loaded = False  # `configure_model` reads the weights: no I/O in the constructor
        self.model_ema = ema_copy(self.model, self.optim.ema_decay, self.finetune.trained)
        if hp.compile:
            # nn.Module.compile compiles forward in place, unlike torch.compile(model) which wraps the
            # model and renames every key "_orig_mod.*". After the EMA copy, which stays eager.
            self.model.compile()

    def build_network(self) -> nn.Module:
        """The network the backbone builds for this run's classes (a subclass may ask for more of it)."""
        return self.create_vit(self.hparams.num_classes)

    def configure_model(self) -> None:
        """Load the ``pretrained`` weights, once (Lightning calls this before every fit/validate/test/predict,
        and before restoring a checkpoint; call it yourself to use the model outside a Trainer).

        Here rather than in ``__init__``: a missing file or unreachable hub is then a plain error from the
        command, not a config-validation failure inside jsonargparse."""
        if self.pretrained_loaded or not self.hparams.pretrained:
            return
        if self.hparams.head_init.partition(":")[0] == "zeroshot":
            from vit.tasks.contrastive import zeroshot_start

            templates = self.hparams.head_init.partition(":")[2] or None
            zeroshot_start(self.model, self.hparams.pretrained, self.class_names, templates)
        else:  # adapters: the base under them, and its hash
            self.finetune.load_pretrained(self.model, self.hparams.pretrained, self.backbone.load_pretrained)
        if self.model_ema is not None:
            self.model_ema.set(self.model)  # the copy was made from the random initialisation
        self.pretrained_loaded = True

    def configure_preprocessing(self, class_names: Sequence[str] | None, given: Any) -> None:
        """What the checkpoint records about the inputs: class names, and how the data prepared its images."""
        self.class_names = list(class_names) if class_names else [str(i) for i in range(self.hparams.num_classes)]
        given = as_config(given) or {}  # (a config's, a checkpoint's: plain data) None: the defaults for the channels
        self.preprocessing = Preprocessing.for_channels(self.model.in_chans, **given)  # `self.mean` etc. read it

    def configure_losses(self, class_weights: Tensor | None = None) -> None:
        """The head's training loss (optionally class-weighted), evaluation loss, and mixing of batches."""
        n = self.hparams.num_classes
        self.mixup = self.head.mixer(n)
        self.train_loss = self.head.train_loss(n, class_weights)
        self.eval_loss = self.head.eval_loss(n)

    def setup(self, stage: str) -> None:
        self.finetune.check_sharding(self.trainer.strategy)  # before FSDP wraps the model
        check_ema_sharding(self.trainer.strategy, self.model_ema)
        if stage == "fit" and self.head.class_weighting:
            counts = self.head.training_counts(self.trainer.datamodule)
            weights = self.head.class_weights(counts, self.class_names)
            self.configure_losses(weights.to(self.device))
            rank_zero_info("class weights: " + ", ".join(f"{n} {w:.2f}" for n, w in zip(self.class_names, weights)))

    def configure_metrics(self) -> None:
        """The head's training metrics, and its evaluation: validation and test (`vit.tasks.evaluation`)."""
        self.train_metrics = self.head.metrics(self.hparams.num_classes)[0].clone(prefix="train_")
        self.evaluation = self.head.evaluation(self.hparams.num_classes)

    # --- what prediction needs -------------------------------------------------------------
    @property
    def eval_model(self) -> nn.Module:
        """The weights used for validation, test and prediction: the EMA when it is on."""
        return self.model_ema.module if self.model_ema is not None else self.model

    def forward(self, x: Tensor) -> Tensor:
        """Logits (B, num_classes) of the evaluation weights."""
        return self.eval_model(x)

    # --- steps -----------------------------------------------------------------------------
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = self.unpack(batch)
        self.check_images(x)
        if self.mixup is not None:
            x, y = self.mixup(x, y)  # soft targets: no training accuracy
        loss, logits = self.loss_and_logits(x, y)
        if self.mixup is None:
            self.train_metrics.update(*self.head.metric_inputs(logits, y))
            self.log_dict(self.train_metrics, on_step=False, on_epoch=True)
        self.check_loss(loss)
        self.log("train_loss", loss, prog_bar=True)
        self.log("lr", self.optimizers().param_groups[-1]["lr"], prog_bar=False)
        return loss

    def loss_and_logits(self, x: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """(training loss, logits) of the model on images ``x``."""
        logits = self.model(x)
        return self.train_loss(logits, targets), logits

    # --- fine-tuning strategy ----------------------------------------------------------------
    def on_fit_start(self) -> None:
        self.finetune.check_ddp(self.trainer.strategy.model)  # parameters that come and go need find_unused
        rank_zero_info(self.param_group_table())

    def frozen(self, epoch: int) -> Frozen:
        """What does not train in ``epoch`` under this run's strategy (by the network's roles)."""
        return self.finetune.frozen(self.model, self.roles, epoch)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Every step, since validation and Lightning switch modules back to train mode.
        apply_freezing(self.model, self.frozen(self.current_epoch))

    def param_group_table(self) -> str:
        """The optimiser's groups: name, parameters, peak lr, weight decay, and whether they train now."""
        return network_group_table(self.model, self.trainer.optimizers[0], self.frozen(self.current_epoch).names,
                                   self.param_shapes)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        # Here, not in on_train_batch_end: Lightning runs callbacks' on_train_batch_end first, so a mid-epoch
        # checkpoint (every_n_train_steps) would miss this step's update and a resumed run would drift from it.
        if self.model_ema is not None:
            self.model_ema.update(self.model, step=self.global_step)

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        x, y = self.unpack(batch)
        logits = self(x)
        if stage == "test" and self.test_tta == "flip":
            logits = (logits + self(x.flip(-1))) / 2
        self.log(f"{stage}_loss", self.eval_loss(logits, y), prog_bar=stage == "val", sync_dist=True)
        self.log_dict(self.evaluation.step(stage, x, logits, y), prog_bar=True)
        return logits

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    # --- the evaluation's epochs: the head's (`vit.tasks.evaluation`) -----------------------------
    def on_validation_epoch_start(self) -> None:
        self.evaluation.start("val", self.trainer.val_dataloaders)

    def on_test_epoch_start(self) -> None:
        self.evaluation.start("test", self.trainer.test_dataloaders)

    def on_validation_epoch_end(self) -> None:  # values already global: averaging equal values changes nothing
        self.log_dict(self.evaluation.end("val", self.evaluated_run()), prog_bar=True, sync_dist=True)

    def on_test_epoch_end(self) -> None:
        self.log_dict(self.evaluation.end("test", self.evaluated_run()), sync_dist=True)

    def evaluated_run(self) -> Run:
        """What the evaluation's epoch end reads of this run: classes, normalisation, model, run folder, rank."""
        t = self.trainer
        return Run(self.class_names, self.mean, self.std, self.eval_model, t.log_dir, t.is_global_zero, t.loggers,
                   self.global_step, counted=not t.sanity_checking)

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """The head's answer (e.g. class probabilities (B, num_classes)); the batch is images or (images, anything)."""
        return self.head.predict(self(self.unpack(batch)[0]))

    # --- optimiser: the optim part's, with the strategy's groups and the step the rest starts training -------------
    def configure_optimizers(self) -> dict[str, Any]:
        o = self.optim
        lr = self.scaled_lr(o.lr, o.lr_base_batch, "optim.lr", "optim.lr_base_batch")
        groups = param_groups(self.model, lr, o.weight_decay, o.layer_decay, shapes=self.param_shapes, roles=self.roles)
        groups = self.finetune.optimizer_groups(self.model, groups)  # adapters: the frozen base has no place
        optimizer = adamw(groups, lr=lr, betas=o.betas)
        warmup, total = self.schedule_steps(o.warmup_epochs, o.warmup_steps)
        if o.schedule == "onecycle" and total >= 3:  # (1-2 steps, e.g. fast_dev_run: the cosine lambda below)
            return step_schedule(optimizer, one_cycle(optimizer, warmup, total))
        unfreeze = self.finetune.unfreeze_epoch()  # Staged, Adapters(head_epochs): the head alone first
        start = None if unfreeze is None else unfreeze * per_epoch_steps(self.trainer, total)
        return step_schedule(optimizer, group_schedules(groups, warmup, total, self.min_lr_ratio(o.min_lr, lr), start))

    # --- checkpoint (checked on loading by VisionTask.on_load_checkpoint) ---------------------
    def checkpoint_meta(self) -> dict[str, Any]:
        """What `vit.deploy.load_classifier` needs besides the weights: task, model, classes, preparation, and what
        the evaluation chose (a multi-label model's thresholds)."""
        return classify_meta(
            self.model_name, self.model_config, self.class_names,
            self.preprocessing.to_dict(),  # mean, std, crop_pct, interpolation
            ema=self.model_ema is not None,
            **self.backbone.meta(self.hparams.img_size),
            **self.evaluation.checkpoint_meta(),
            **self.finetune.checkpoint_meta(self.hparams.pretrained, self.configure_model),  # adapters: "lora"
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["state_dict"] = self.finetune.saved_state(checkpoint["state_dict"], self.hparams.pretrained)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        # adapters without their base: the base as `pretrained` or the checkpoint names it, then the state dict
        if self.finetune.restore(checkpoint, self.model, self.configure_model, self.backbone.load_pretrained):
            self.pretrained_loaded = True  # (named by the checkpoint alone)
            if self.model_ema is not None:
                self.model_ema.set(self.model)
        self.evaluation.load_meta(checkpoint[META_KEY])


def check_head_init(head_init: str, pretrained: str | None, backbone: str) -> None:
    """``head_init`` "zeroshot" (or "zeroshot:TEMPLATES") needs a CLIP to read the class names with (``pretrained``)
    and our ViT."""
    kind, templates = head_init.partition(":")[::2]
    if kind not in ("random", "zeroshot") or (kind == "random" and templates):
        raise UserValueError(f"head_init must be one of random, zeroshot (or zeroshot:TEMPLATES, a named set or a "
                             f"file), got {head_init!r}")
    if kind == "zeroshot" and not pretrained:
        raise UserValueError("head_init: zeroshot reads the class names with a CLIP's text tower: set pretrained to a "
                             "CLIP or SigLIP (a hub tag, an OpenCLIP file or folder, or a ContrastiveTask checkpoint)")
    if kind == "zeroshot" and backbone != "vit":
        raise UserValueError(f"head_init: zeroshot builds our ViT's image tower; backbone {backbone!r} cannot take it")

__all__ = ["ImageClassifier", "check_head_init"]


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # 0.1's MOVED, old_arguments, upgraded_hparams (vit/_graveyard.py)
