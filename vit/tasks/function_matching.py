"""Function-matching distillation (Beyer et al., 2022, "a good teacher is patient and consistent"), on the labelled
images and the unlabelled pool (`vit.data.pool`) alike:

    labelled (B_l) ┐                      ┌─► student ─► logits ─┬─► τ²·KL(softmax(t/τ) ‖ softmax(s/τ))  every row
    pool (B_u)     ┴─► one augmented view ─► mixup / cutmix ─────┤                                       (consistent)
                                          └─► teacher (frozen, inference mode, bf16 where the CPU has it) ─┘
                                              labelled rows: + label_weight·CE(logits, mixed labels)

Teacher and student see the same mixed view, made fresh every step: nothing is cached, so the student matches
the teacher's function on ever new points between the images (patient). The labelled rows mix with labelled
rows (their mixed labels are known); the pool's rows mix with any row. The teacher is any `vit fit` checkpoint
(`vit.tasks.distill.load_teacher`: a convnet, a fine-tuned or LoRA-merged ViT, ...) and/or a frozen foundation
backbone (``features``: a ``pretrained:`` file or tag for our ViT ``features_model``) whose pooled and patch
features the student matches: cosine on the student's tokens projected to the teacher's width (LightlyTrain's
distillation, the DINOv2-distilled ViTs), the teacher's patch grid pooled to the student's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from vit.errors import UserPathError, UserValueError
from vit.tasks.backbones import ViTBackbone
from vit.tasks.classify import ImageClassifier
from vit.tasks.distill import Teacher, load_teacher, translation
from vit.tasks.optim import adamw, group_schedules, one_cycle, param_groups, step_schedule

MIXES = ("mixup", "cutmix", "both", "none")


# ---- the losses ------------------------------------------------------------------------------
def function_matching_loss(student: Tensor, teacher: Tensor, tau: float = 1.0) -> Tensor:
    """τ²·KL(softmax(teacher/τ) ‖ softmax(student/τ)): the KL summed over classes, averaged over the rows (big_vision's
    ``distill`` loss, which is this at τ 1 up to the teacher's entropy, a constant)."""
    return tau**2 * F.kl_div(F.log_softmax(student.float() / tau, dim=-1), F.log_softmax(teacher.float() / tau, dim=-1),
                             reduction="batchmean", log_target=True)


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy against probability rows (mixed labels), averaged over the rows."""
    return -(targets * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()


def feature_matching_loss(pooled: Tensor, patches: Tensor, teacher_pooled: Tensor, teacher_patches: Tensor) -> Tensor:
    """(1 - cos) of the pooled features, plus (1 - cos) of each patch token, each averaged over its rows."""
    first = 1 - F.cosine_similarity(pooled.float(), teacher_pooled.float(), dim=-1).mean()
    return first + 1 - F.cosine_similarity(patches.float(), teacher_patches.float(), dim=-1).mean()


def to_grid(patches: Tensor, grid: Sequence[int], size: Sequence[int]) -> Tensor:
    """Patch tokens (B, h*w, D) on ``grid`` (h, w) resampled to ``size``: area-averaged down, bilinear up."""
    if tuple(grid) == tuple(size):
        return patches
    b, _, d = patches.shape
    planes = patches.transpose(1, 2).reshape(b, d, *grid)
    if size[0] <= grid[0] and size[1] <= grid[1]:
        planes = F.adaptive_avg_pool2d(planes, tuple(size))
    else:
        planes = F.interpolate(planes, size=tuple(size), mode="bilinear", align_corners=False)
    return planes.flatten(2).transpose(1, 2)


# ---- mixing ----------------------------------------------------------------------------------
def mix_images(x: Tensor, labelled: int, mode: str, alpha: float) -> tuple[Tensor, Tensor, float]:
    """(mixed images, each row's partner, λ): mixup (λx + (1-λ)x[partner]) or cutmix (a box of the partner's pixels,
    λ the share kept) at λ ~ Beta(α, α); "both" picks one per batch. The first ``labelled`` rows pair among
    themselves, the others with any row. Draws from numpy's and torch's global generators (saved in checkpoints)."""
    partners = torch.cat([torch.randperm(labelled), torch.randperm(len(x))[: len(x) - labelled]]).to(x.device)
    if mode == "none" or alpha <= 0:
        return x, torch.arange(len(x), device=x.device), 1.0
    lam = float(np.random.beta(alpha, alpha))
    if mode == "cutmix" or (mode == "both" and np.random.rand() < 0.5):
        h, w = x.shape[-2:]
        ch, cw = int(h * np.sqrt(1 - lam)), int(w * np.sqrt(1 - lam))
        cy, cx = np.random.randint(h), np.random.randint(w)
        y0, y1 = np.clip(cy - ch // 2, 0, h), np.clip(cy + ch - ch // 2, 0, h)
        x0, x1 = np.clip(cx - cw // 2, 0, w), np.clip(cx + cw - cw // 2, 0, w)
        mixed = x.clone()
        mixed[..., y0:y1, x0:x1] = x[partners][..., y0:y1, x0:x1]
        return mixed, partners, 1 - float((y1 - y0) * (x1 - x0)) / (h * w)
    return lam * x + (1 - lam) * x[partners], partners, lam


# ---- a frozen foundation backbone -------------------------------------------------------------
class _Features(nn.Module):
    """A ViT's (pooled features (B, D), patch tokens (B, h*w, D)), no head."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.vit = network

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        tokens = self.vit.forward_features(x)
        return self.vit.forward_head(tokens, pre_logits=True), tokens[:, self.vit.num_prefix_tokens:]


def load_feature_teacher(source: str, model: str, img_size: int | None, mean: Sequence[float], std: Sequence[float],
                         teacher_mean: Sequence[float], teacher_std: Sequence[float]) -> Teacher:
    """Our ViT ``model`` without a head, with ``source``'s weights (`vit.load_pretrained`: a file, a hub tag),
    frozen, at ``img_size`` (its patch grid resampled), taking images prepared (mean, std) as its own."""
    from vit.checkpoints.weights import load_pretrained
    from vit.nn.vision import create_model

    network = create_model(model, num_classes=0, **({"img_size": img_size} if img_size else {}))
    load_pretrained(network, source)
    renorm = translation(mean, std, teacher_mean, teacher_std)
    return Teacher(_Features(network), f"{source} ({model}, features)", None, tuple(network.img_size), renorm)


def feature_normalisation(source: str, model: str) -> tuple[Sequence[float], Sequence[float]]:
    """The (mean, std) a foundation backbone was trained on, as ``pretrained:`` reads them
    (`vit.checkpoints.pretrained_cfg`: a timm tag's, a hub folder's, else the architecture ``model``'s default:
    ImageNet's for DINOv2, 0.5 for SigLIP); ImageNet's where the source says nothing. A SigLIP fed ImageNet's
    statistics sees shifted inputs."""
    from vit.checkpoints.pretrained_cfg import pretrained_preprocessing
    from vit.preprocessing import IMAGENET_MEAN, IMAGENET_STD

    found = pretrained_preprocessing(source, model)
    return (found[0]["mean"], found[0]["std"]) if found else (IMAGENET_MEAN, IMAGENET_STD)


def pooled_width(network: nn.Module) -> int:
    """The width of a ViT's pooled features (its head's input): the token width, or a CLIP projection's."""
    with torch.no_grad():
        tokens = torch.zeros(1, network.num_prefix_tokens + 1, network.embed_dim)
        return network.forward_head(tokens, pre_logits=True).shape[-1]


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX): only then is a bf16 teacher faster."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


# ---- the task --------------------------------------------------------------------------------
class FunctionMatching(ImageClassifier):
    """A student that matches its teacher's function on labelled and unlabelled images (see the module docstring):
    configs/distill_unlabelled.yaml, with ``--data.init_args.unlabelled_root DIR``. Without a pool it matches on
    the labelled images alone. The student is any classifier ``model``; feature matching needs our ViT.

    Args:
        teacher: a `vit fit` checkpoint of this run's classes (or "best"/"last" of ``teacher_dir``); with
            ``teacher_weights``, a timm model name. Read when fitting starts.
        teacher_weights: the weights of the timm model ``teacher`` names.
        teacher_dir: the teacher run's checkpoint folder, where ``teacher: best`` looks.
        features: a frozen foundation backbone's weights (a file or tag ``pretrained:`` reads), whose pooled and
            patch features the student matches; with or without ``teacher``.
        features_model: our ViT that ``features`` fits (vit.list_models(), e.g. vit_small_patch14_dinov2).
        features_img_size: the side ``features`` sees (the student's images are resized; None: its own).
        tau: the softmax temperature of the KL.
        label_weight: the weight of the labelled rows' cross-entropy (0: the teacher alone).
        feature_weight: the weight of the feature loss.
        mix: "mixup", "cutmix", "both" (one per batch) or "none"; ``mix_alpha``: λ ~ Beta(α, α).
        teacher_bf16: run the teachers in bf16 (None: where the device computes it natively).
        **kwargs: the `ImageClassifier` options (``model``, ``optim``, ...).
    """

    unlabelled_views = ("train",)  # one view: teacher and student see the same one

    def __init__(self, teacher: str | None = None, teacher_weights: str | None = None, teacher_dir: str | None = None,
                 features: str | None = None, features_model: str = "vit_base_patch16_224",
                 features_img_size: int | None = None, tau: float = 1.0, label_weight: float = 0.5,
                 feature_weight: float = 1.0, mix: str = "mixup", mix_alpha: float = 1.0,
                 teacher_bf16: bool | None = None, **kwargs: Any) -> None:
        if mix not in MIXES:
            raise UserValueError(f"mix must be one of {', '.join(MIXES)}, got {mix!r}")
        if not tau > 0 or label_weight < 0 or feature_weight < 0:
            raise UserValueError(f"tau must be > 0 and the weights >= 0, got tau {tau}, label_weight {label_weight}, "
                                 f"feature_weight {feature_weight}")
        if teacher is None and features is None:
            raise UserValueError("function matching needs a teacher: model.init_args.teacher PATH.ckpt (a `vit fit` "
                                 "checkpoint), or model.init_args.features (a foundation backbone's weights)")
        super().__init__(**kwargs)
        self.teacher: Teacher | None = None
        self.feature_teacher: Teacher | None = None
        self.projections: nn.ModuleDict | None = None
        if features is not None:
            if not isinstance(self.backbone, ViTBackbone):
                raise UserValueError("feature matching reads the student's tokens: a ViT student (backbone: vit)")
            from vit.nn.vision import create_model

            teacher = create_model(features_model, num_classes=0, depth=1)  # for its widths alone
            self.projections = nn.ModuleDict({"pooled": nn.Linear(pooled_width(self.model), pooled_width(teacher)),
                                              "patches": nn.Linear(self.model.embed_dim, teacher.embed_dim)})

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if stage == "fit" and self.teacher is None and hp.teacher is not None:
            if hp.teacher not in ("best", "last") and hp.teacher_weights is None and not Path(hp.teacher).exists():
                raise UserPathError(f"teacher: no such checkpoint {hp.teacher}; give a `vit fit` checkpoint of this "
                                    "run's classes, or teacher: best with teacher_dir (configs/teacher_small.yaml's)")
            self.teacher = load_teacher(hp.teacher, weights=hp.teacher_weights, folder=hp.teacher_dir,
                                        num_classes=hp.num_classes, in_chans=self.model.in_chans,
                                        class_names=self.class_names, mean=self.mean, std=self.std)
        if stage == "fit" and self.feature_teacher is None and hp.features is not None:
            self.feature_teacher = load_feature_teacher(hp.features, hp.features_model, hp.features_img_size,
                                                        self.mean, self.std, *feature_normalisation(hp.features,
                                                                                                    hp.features_model))
        if stage == "fit":
            rank_zero_info(f"function matching (tau {hp.tau}, label_weight {hp.label_weight}, {hp.mix} "
                           f"alpha {hp.mix_alpha}) from {self.teacher_names()}")
        super().setup(stage)

    def teacher_names(self) -> str:
        return " and ".join(t.source for t in (self.teacher, self.feature_teacher) if t is not None)

    def _bf16(self, device: torch.device) -> bool:
        if self.hparams.teacher_bf16 is not None:
            return self.hparams.teacher_bf16
        return torch.cuda.is_bf16_supported() if device.type == "cuda" else cpu_has_bf16()

    def taught(self, teacher: Teacher, x: Tensor) -> Any:
        """The teacher's answer to ``x``, in inference mode (bf16 where it pays), as float tensors autograd reads."""
        with torch.inference_mode(), torch.autocast(x.device.type, torch.bfloat16, enabled=self._bf16(x.device)):
            out = teacher(x)
        return tuple(o.float().clone() for o in out) if isinstance(out, tuple) else out.float().clone()

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        if isinstance(batch, dict):  # labelled and pool (`vit.data.pool`): one view of each pool image
            (x, y), views = batch["labelled"], batch["unlabelled"]
            labelled, x = len(x), torch.cat([x, views[0]])
        else:
            x, y = self.unpack(batch)
            labelled = len(x)
        self.check_images(x)
        x, partners, lam = mix_images(x, labelled, self.hparams.mix, self.hparams.mix_alpha)
        parts = self.losses(x, y, labelled, partners, lam)
        loss = sum(parts.values())
        self.check_loss(loss)
        self.log("train_loss", loss, prog_bar=True)
        self.log_dict({f"train_{name}": value for name, value in parts.items()})
        return loss

    def losses(self, x: Tensor, y: Tensor, labelled: int, partners: Tensor, lam: float) -> dict[str, Tensor]:
        """The step's losses by name: "kl" (the teacher's logits), "features", "labels"."""
        hp, parts = self.hparams, {}
        if self.projections is not None:
            tokens = self.model.tokens(x)
            logits = self.model.forward_head(tokens)
            pooled, patches = self.taught(self.feature_teacher, x)
            grid = self.model.patch_grid(*x.shape[-2:])
            teacher_grid = self.feature_teacher.network.vit.patch_grid(*self.feature_teacher.img_size)
            parts["features"] = hp.feature_weight * feature_matching_loss(
                self.projections["pooled"](self.model.forward_head(tokens, pre_logits=True)),
                self.projections["patches"](tokens[:, self.model.num_prefix_tokens:]),
                pooled, to_grid(patches, teacher_grid, grid))
        else:
            logits = self.model(x)
        if self.teacher is not None:
            parts["kl"] = function_matching_loss(logits, self.taught(self.teacher, x), hp.tau)
        if labelled and hp.label_weight > 0:
            onehot = F.one_hot(y, hp.num_classes).float()
            targets = lam * onehot + (1 - lam) * onehot[partners[:labelled]]
            parts["labels"] = hp.label_weight * soft_cross_entropy(logits[:labelled], targets)
        return parts

    def on_train_start(self) -> None:
        self.epoch_started = time.perf_counter()  # a run resumed mid-epoch starts no epoch

    def on_train_epoch_start(self) -> None:
        self.epoch_started = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        """The teachers' share of the epoch (``teacher_ms``, ``features_ms``: their forward's ms a step)."""
        for name, teacher in (("teacher", self.teacher), ("features", self.feature_teacher)):
            if teacher is not None:
                ms, line = teacher.report(time.perf_counter() - self.epoch_started)
                self.log(f"{name}_ms", ms, sync_dist=True)
                rank_zero_info(f"epoch {self.current_epoch}: {name}: {line}")

    def configure_optimizers(self) -> dict[str, Any]:
        """`ImageClassifier`'s AdamW and schedule, with the feature projections as one more group."""
        o = self.optim
        lr = self.scaled_lr(o.lr, o.lr_base_batch, "optim.lr", "optim.lr_base_batch")
        groups = param_groups(self.model, lr, o.weight_decay, o.layer_decay, shapes=self.param_shapes, roles=self.roles)
        if self.projections is not None:
            groups.append({"params": list(self.projections.parameters()), "lr": lr, "weight_decay": o.weight_decay,
                           "name": "head_projections"})
        optimizer = adamw(groups, lr=lr, betas=o.betas)
        warmup, total = self.schedule_steps(o.warmup_epochs, o.warmup_steps)
        if o.schedule == "onecycle" and total >= 3:
            return step_schedule(optimizer, one_cycle(optimizer, warmup, total))
        return step_schedule(optimizer, group_schedules(groups, warmup, total, self.min_lr_ratio(o.min_lr, lr), None))

    def checkpoint_meta(self) -> dict[str, Any]:
        """The classifier's record, and the teachers it learnt from (the model card names them)."""
        meta = super().checkpoint_meta()
        return {**meta, "teacher": self.teacher_names()} if self.teacher_names() else meta


__all__ = ["MIXES", "FunctionMatching", "feature_matching_loss", "function_matching_loss", "mix_images",
           "soft_cross_entropy", "to_grid"]
