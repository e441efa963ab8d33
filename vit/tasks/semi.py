"""Semi-supervised training on the labelled images and the unlabelled pool (`vit.data.pool`): FixMatch (Sohn et
al., 2020), its confidence read from temperature-scaled probabilities (`vit.tasks.semi_losses`).

    labelled (B, weak aug) ─────────────► model ─► CE(logits, y)                                   L_s
    pool ─┬─ weak view ─► model ─► (no gradient) softmax(logits_w / T) ─► pseudo-label, mask ≥ τ
          └─ strong view (RandAugment + erasing) ─► model ─► CE(logits_s, pseudo-label)·mask        L_u
    loss = L_s + unlabelled_weight · L_u

The three go through the model as one batch (one forward, BatchNorm-free ViTs need no interleaving). T is fit on
the validation images' logits at the end of every validation epoch (`vit.deploy.calibration.fit_temperature`; 1
until the first), and saved with the task, so a resumed run uses the T the interrupted one had. ``calibrate:
false`` keeps T at 1: FixMatch as published.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from vit.data.transforms import Augmentation
from vit.errors import UserValueError
from vit.tasks.classify import ImageClassifier
from vit.tasks.semi_losses import pseudo_labels, unlabelled_loss


class FixMatch(ImageClassifier):
    """FixMatch on the pool given as ``--data.init_args.unlabelled_root`` (configs/semi_small.yaml).

    Args:
        threshold: τ, the calibrated confidence a pool image's pseudo-label needs to count.
        unlabelled_weight: λ_u, the weight of the pool's loss.
        calibrate: read the confidence at the temperature fit on val (False: the raw softmax).
        teacher: what labels the weak view: "model", the weights being trained (FixMatch as published), or
            "ema", their EMA (``optim.ema_decay``; Semi-ViT's EMA-Teacher, Cai et al., 2022), the weights that
            validation, and so the temperature, read.
        weak_view, strong_view: the pool's two augmentations (default: `vit.data.pool`'s WEAK and STRONG).
        **kwargs: the `ImageClassifier` options (``model``, ``optim``, ...).
    """

    unlabelled_views = ("weak", "strong")  # `vit.data.pool`'s two augmentations of each pool image

    def __init__(self, threshold: float = 0.95, unlabelled_weight: float = 1.0, calibrate: bool = True,
                 teacher: str = "model", weak_view: Augmentation | None = None,
                 strong_view: Augmentation | None = None, **kwargs: Any) -> None:
        if not 0 < threshold <= 1 or unlabelled_weight < 0:
            raise UserValueError(f"threshold must be in (0, 1] and unlabelled_weight >= 0, got {threshold} and "
                                 f"{unlabelled_weight}")
        if teacher not in ("model", "ema"):
            raise UserValueError(f"teacher must be 'model' or 'ema' (needs optim.ema_decay), got {teacher!r}")
        super().__init__(**kwargs)
        self.unlabelled_views = (weak_view or "weak", strong_view or "strong")
        self.register_buffer("temperature", torch.ones(()))  # in the checkpoint: a resumed run reads the same T
        self._val_logits: list[Tensor] = []
        self._val_labels: list[Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if not isinstance(batch, dict):  # no pool: plain supervised training
            return super().training_step(batch, batch_idx)
        (x, y), (weak, strong) = batch["labelled"], batch["unlabelled"]
        self.check_images(x)
        if self.hparams.teacher == "ema" and self.model_ema is not None:
            with torch.no_grad():  # the EMA weights label the weak view: the T fit on val is theirs too
                weak_logits = self.model_ema.module(weak)
            logits = self.model(torch.cat([x, strong]))
            labelled, strong_logits = logits[: len(x)], logits[len(x):]
        else:
            logits = self.model(torch.cat([x, weak, strong]))
            labelled, (weak_logits, strong_logits) = logits[: len(x)], logits[len(x):].chunk(2)
        supervised = self.train_loss(labelled, y)
        thresholds = torch.full((logits.shape[-1],), self.hparams.threshold, device=logits.device)
        label, confidence, mask = pseudo_labels(weak_logits, float(self.temperature), thresholds)
        loss = supervised + self.hparams.unlabelled_weight * unlabelled_loss(strong_logits, label, mask)
        self.check_loss(loss)
        self.log("train_loss", loss, prog_bar=True)
        self.log_dict({"train_supervised": supervised, "pool_mask": mask.mean(), "pool_confidence": confidence.mean()})
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        logits = self._eval_step(batch, "val")
        if not self.trainer.sanity_checking:
            self._val_logits.append(logits.detach().float().cpu())
            self._val_labels.append(self.unpack(batch)[1].cpu())

    def update_temperature(self, logits: Tensor, labels: Tensor) -> None:
        """T fit on val's ``logits``; where every val image is right, which says nothing of T (`fit_temperature`'s 1
        is its no-answer), the last T stays. A few labels leave a few val images (10 of 100 digits), all right from
        mid-run on: T back at 1 let the under-confident raw softmax pass no pool image for the rest of the run."""
        from vit.deploy.calibration import fit_temperature

        if not bool((logits.argmax(-1) == labels).all()):
            self.temperature.fill_(fit_temperature(logits, labels))

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self._val_logits and self.hparams.calibrate:
            logits, labels = torch.cat(self._val_logits), torch.cat(self._val_labels)
            logits = self.all_gather(logits).flatten(0, -2) if self.trainer.world_size > 1 else logits
            labels = self.all_gather(labels).flatten() if self.trainer.world_size > 1 else labels
            self.update_temperature(logits, labels)
            self.log("pool_temperature", self.temperature, sync_dist=False)
            rank_zero_info(f"FixMatch: confidence read at T = {float(self.temperature):.3f} (fit on val)")
        self._val_logits, self._val_labels = [], []


__all__ = ["FixMatch"]
