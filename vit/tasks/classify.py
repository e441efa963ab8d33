"""Image classification with a VisionTransformer, as a LightningModule.

The module owns what training needs (loss, optimiser, schedule, EMA, metrics) and writes into the
checkpoint what prediction needs (model name and config, class names, image size, in_chans and the
normalisation mean/std), so `load_classifier(path)` rebuilds a ready model without the training config.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from vit.data.images import IMAGENET_MEAN, IMAGENET_STD
from vit.nn.vision import MODEL_CONFIGS, VisionTransformer, create_model
from vit.weights import load_pretrained

log = logging.getLogger(__name__)

# Checkpoint key holding what prediction needs; see `ImageClassifier.on_save_checkpoint`.
CHECKPOINT_KEY = "vit_classifier"



def layer_id(name: str, depth: int) -> int:
    """Layer index for layer-wise LR decay: embeddings 0, block i -> i + 1, norms and head depth + 1."""
    if name.startswith(("patch_embed.", "cls_token", "pos_embed")):
        return 0
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    return depth + 1


def param_groups(
    model: VisionTransformer, lr: float, weight_decay: float, layer_decay: float | None = None
) -> list[dict[str, Any]]:
    """AdamW parameter groups: no decay on biases, norms, pos_embed and cls_token; per-layer lr.

    Each group's ``lr`` is set directly (``lr * layer_decay ** (depth + 1 - layer)``) because
    Lightning's scheduler stepping knows nothing of timm's ``lr_scale`` key.
    """
    depth = len(model.blocks)
    skip = model.no_weight_decay()
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim <= 1 or name in skip
        layer = layer_id(name, depth) if layer_decay is not None else depth + 1
        scale = layer_decay ** (depth + 1 - layer) if layer_decay is not None else 1.0
        key = (layer, no_decay)
        if key not in groups:
            groups[key] = {
                "params": [], "lr": lr * scale, "weight_decay": 0.0 if no_decay else weight_decay,
                "name": (f"layer{layer}_" if layer_decay is not None else "")
                + ("no_decay" if no_decay else "decay"),
            }
        groups[key]["params"].append(p)
    return [groups[k] for k in sorted(groups)]


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up from ~0 to 1, then cosine down to ``min_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class ImageClassifier(LightningModule):
    """A ViT classifier: label-smoothed CE (or mixup/cutmix soft targets), AdamW with layer decay,
    warm-up + cosine per step, optional EMA, torchmetrics accuracy and a test confusion matrix.

    Args:
        model: a name from ``vit.list_models()``.
        num_classes: number of classes (linked from the datamodule by the CLI).
        img_size: input side (linked from the datamodule); ``None`` keeps the named config's.
        in_chans: input channels (linked from the datamodule); ``None`` keeps the named config's.
        model_kwargs: other ``VisionTransformer`` overrides, e.g. ``{drop_path_rate: 0.1}``.
        pretrained: weights for ``vit.load_pretrained`` (a file or timm name); a new head is fine.
        class_names: names of the classes, stored in the checkpoint (linked from the datamodule).
        mean, std: normalisation the data used, stored in the checkpoint (linked from the datamodule);
            ``None``: ImageNet's for 3 channels, 0.5 otherwise.
        crop_pct: evaluation centre-crop fraction the data used, stored in the checkpoint (linked).
        interpolation: resize interpolation the data used, stored in the checkpoint (linked).
        lr: peak learning rate of the last layer group (the head).
        weight_decay: AdamW decoupled weight decay (not applied to biases, norms and embeddings).
        betas: AdamW betas.
        warmup_epochs: linear warm-up length in epochs (fractions allowed).
        warmup_steps: warm-up length in optimiser steps; overrides ``warmup_epochs`` when set.
        min_lr: the cosine schedule's floor for the head group.
        layer_decay: layer-wise LR decay factor (e.g. 0.75 for fine-tuning); ``None`` = off.
        label_smoothing: label smoothing of the cross-entropy (also used by mixup's soft targets).
        mixup_alpha, cutmix_alpha: timm ``Mixup`` strengths; mixup is on when either is > 0.
        mixup_prob: probability of applying mixup or cutmix to a batch.
        mixup_switch_prob: probability of cutmix instead of mixup when both are on.
        ema_decay: decay of timm's ``ModelEmaV3``; ``None`` = no EMA. Validation and test use it.
    """

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
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_epochs: float = 0.0,
        warmup_steps: int | None = None,
        min_lr: float = 1e-6,
        layer_decay: float | None = None,
        label_smoothing: float = 0.1,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mixup_prob: float = 1.0,
        mixup_switch_prob: float = 0.5,
        ema_decay: float | None = None,
    ) -> None:
        super().__init__()
        if model not in MODEL_CONFIGS:
            raise ValueError(f"unknown model {model!r}; known models: {', '.join(sorted(MODEL_CONFIGS))}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        if class_names is not None and len(class_names) != num_classes:
            raise ValueError(f"got {len(class_names)} class_names for num_classes={num_classes}")
        self.save_hyperparameters()

        overrides = dict(model_kwargs or {}, num_classes=num_classes)
        if img_size is not None:
            overrides["img_size"] = img_size
        if in_chans is not None:
            overrides["in_chans"] = in_chans
        # The full VisionTransformer config, so a checkpoint rebuilds the model on its own.
        self.model_config: dict[str, Any] = {**MODEL_CONFIGS[model], **overrides}
        self.model: VisionTransformer = create_model(model, **overrides)
        if pretrained:
            load_pretrained(self.model, pretrained)

        self.model_name = model
        self.class_names = list(class_names) if class_names else [str(i) for i in range(num_classes)]
        chans = self.in_chans
        if mean is None:
            mean = IMAGENET_MEAN if chans == 3 else (0.5,) * chans
        if std is None:
            std = IMAGENET_STD if chans == 3 else (0.5,) * chans
        if len(mean) != chans or len(std) != chans:
            raise ValueError(
                f"mean {list(mean)} and std {list(std)} need one value per input channel ({chans})"
            )
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.crop_pct = float(crop_pct)
        self.interpolation = interpolation

        self.mixup = None
        if mixup_alpha > 0 or cutmix_alpha > 0:
            from timm.data import Mixup
            from timm.loss import SoftTargetCrossEntropy

            self.mixup = Mixup(
                mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, prob=mixup_prob,
                switch_prob=mixup_switch_prob, label_smoothing=label_smoothing, num_classes=num_classes,
            )
            self.train_loss: nn.Module = SoftTargetCrossEntropy()
        else:
            self.train_loss = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        self.eval_loss = nn.CrossEntropyLoss()

        self.model_ema = None
        if ema_decay is not None:
            from timm.utils import ModelEmaV3

            self.model_ema = ModelEmaV3(self.model, decay=ema_decay)
            # The copy follows the weights by averaging, never by gradients: freeze it, or DDP
            # fails on parameters that require grad but take no part in the loss.
            self.model_ema.requires_grad_(False)
            # timm leaves the copy in eval mode; Lightning switches modes for val/test/predict anyway,
            # and a train-mode copy avoids its "modules in eval mode at the start of training" warning.
            self.model_ema.train()

        # "micro": the fraction of images classified right (torchmetrics defaults to a class mean).
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.top5 = num_classes >= 5
        if self.top5:
            self.val_acc5 = MulticlassAccuracy(num_classes, top_k=5, average="micro")
            self.test_acc5 = MulticlassAccuracy(num_classes, top_k=5, average="micro")
        self.test_class_acc = MulticlassAccuracy(num_classes, average=None)
        self.test_confusion = MulticlassConfusionMatrix(num_classes)

    # --- what prediction needs -------------------------------------------------------------
    @property
    def img_size(self) -> tuple[int, int]:
        """(height, width) the model expects."""
        return self.model.img_size

    @property
    def in_chans(self) -> int:
        """Number of input channels the model expects."""
        return self.model.patch_embed.proj.in_channels

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
        if self.mixup is not None:
            if len(x) % 2:  # timm's Mixup pairs each sample with its mirror in the batch
                x, y = x[:-1], y[:-1]
            x_mixed, y_soft = self.mixup(x, y)
            logits = self.model(x_mixed)
            loss = self.train_loss(logits, y_soft)
        else:
            logits = self.model(x)
            loss = self.train_loss(logits, y)
            self.train_acc(logits, y)
            self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"loss is {loss.item()} at step {self.global_step}; lower lr or check the inputs"
            )
        self.log("train_loss", loss, prog_bar=True)
        self.log("lr", self.optimizers().param_groups[-1]["lr"], prog_bar=False)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.model_ema is not None:
            self.model_ema.update(self.model, step=self.global_step)

    def _eval_step(self, batch: tuple[Tensor, Tensor], stage: str) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = self.eval_loss(logits, y)
        self.log(f"{stage}_loss", loss, prog_bar=stage == "val", sync_dist=True)  # mean over ranks
        acc = getattr(self, f"{stage}_acc")
        acc(logits, y)
        self.log(f"{stage}_acc", acc, prog_bar=True)
        if self.top5:
            acc5 = getattr(self, f"{stage}_acc5")
            acc5(logits, y)
            self.log(f"{stage}_acc_top5", acc5)
        return logits

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        logits = self._eval_step(batch, "test")
        self.test_class_acc.update(logits, batch[1])
        self.test_confusion.update(logits, batch[1])

    def on_test_epoch_end(self) -> None:
        per_class = self.test_class_acc.compute()  # already global: torchmetrics syncs ranks on compute
        for name, acc in zip(self.class_names, per_class.tolist()):
            # averaging equal values across ranks changes nothing, and tells Lightning it is synced
            self.log(f"test_acc_class/{name}", acc, sync_dist=True)
        confusion = self.test_confusion.compute().cpu()
        self.test_class_acc.reset()
        self.test_confusion.reset()
        self.last_confusion_matrix = confusion
        out_dir = self._log_dir()
        if out_dir is not None and self.trainer.is_global_zero:
            path = save_confusion_matrix(confusion, self.class_names, Path(out_dir) / "confusion_matrix.png")
            log.info("confusion matrix saved to %s", path)

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Class probabilities (B, num_classes); the batch is images or (images, anything)."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x).softmax(dim=-1)

    def _log_dir(self) -> str | None:
        # The logger's run folder (CSV/TensorBoard version dir), else its save dir or default_root_dir.
        return self.trainer.log_dir

    # --- optimiser -------------------------------------------------------------------------
    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        groups = param_groups(self.model, hp.lr, hp.weight_decay, hp.layer_decay)
        optimizer = torch.optim.AdamW(groups, lr=hp.lr, betas=tuple(hp.betas))
        total = max(1, int(self.trainer.estimated_stepping_batches))
        if hp.warmup_steps is not None:
            warmup = hp.warmup_steps
        else:
            batches = self.trainer.num_training_batches
            per_epoch = total if math.isinf(batches) else math.ceil(
                batches / self.trainer.accumulate_grad_batches
            )
            warmup = round(hp.warmup_epochs * per_epoch)
        warmup = min(warmup, total)
        min_ratio = min(1.0, hp.min_lr / hp.lr) if hp.lr > 0 else 0.0
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, warmup, total, min_ratio)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # --- checkpoint ------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "model_name": self.model_name,
            "model_config": dict(self.model_config),
            "class_names": list(self.class_names),
            "img_size": list(self.img_size),
            "in_chans": self.in_chans,
            "mean": list(self.mean),
            "std": list(self.std),
            "crop_pct": self.crop_pct,
            "interpolation": self.interpolation,
            "ema": self.model_ema is not None,
        }


def save_confusion_matrix(confusion: Tensor, class_names: Sequence[str], path: str | os.PathLike) -> Path:
    """Plot a (C, C) confusion matrix (rows: true class, columns: predicted) to a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never opens a window
    import matplotlib.pyplot as plt

    n = len(class_names)
    side = min(20.0, max(4.0, 0.45 * n + 2))
    fig, ax = plt.subplots(figsize=(side, side))
    ax.imshow(confusion.numpy(), cmap="Blues")
    if n <= 30:
        ax.set_xticks(range(n), class_names, rotation=90)
        ax.set_yticks(range(n), class_names)
        top = confusion.max().item()
        for i in range(n):
            for j in range(n):
                v = int(confusion[i, j])
                ax.text(j, i, v, ha="center", va="center", fontsize=8,
                        color="white" if v > top / 2 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(f"confusion matrix ({int(confusion.sum())} images)")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def load_classifier(
    ckpt_path: str | os.PathLike, map_location: str | torch.device = "cpu"
) -> ImageClassifier:
    """Rebuild a trained classifier from a Lightning checkpoint alone, in eval mode.

    The result's ``.model`` is the VisionTransformer holding the evaluated weights (the EMA weights
    when training used EMA); ``.class_names``, ``.img_size`` (H, W), ``.in_chans``, ``.mean``,
    ``.std``, ``.crop_pct`` and ``.interpolation`` say how to prepare its input.
    """
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    # weights_only: a checkpoint is data (tensors, numbers, strings), never code to run.
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(checkpoint, dict) or CHECKPOINT_KEY not in checkpoint:
        raise ValueError(
            f"{path}: not an ImageClassifier checkpoint (no {CHECKPOINT_KEY!r} entry); "
            "it must come from `vit fit` with an ImageClassifier model"
        )
    meta = checkpoint[CHECKPOINT_KEY]
    config = dict(meta["model_config"])
    num_classes = config.pop("num_classes")
    classifier = ImageClassifier(
        model=meta["model_name"], num_classes=num_classes, model_kwargs=config,
        class_names=meta["class_names"], mean=meta["mean"], std=meta["std"],
        crop_pct=meta.get("crop_pct", 1.0), interpolation=meta.get("interpolation", "bicubic"),
        ema_decay=0.0 if meta.get("ema") else None,
    )
    classifier.load_state_dict(checkpoint["state_dict"])
    if classifier.model_ema is not None:  # keep just the evaluated (EMA) weights
        classifier.model.load_state_dict(classifier.model_ema.module.state_dict())
        classifier.model_ema = None
    return classifier.to(map_location).eval()
