"""Knowledge distillation (DeiT, Touvron et al., 2021): the teacher a student learns from, and the two losses.

    images (B, C, H, W) ─┬─► student ─► cls head (B, K) ──► (1-α)·CE(cls, y)
                         │           └► dist head (B, K) ─┐
                         └─► Teacher (frozen) ─► (B, K) ──┴► α·CE(dist, argmax teacher)           "hard"
                                                             α·τ²·KL(softmax(t/τ) ‖ softmax(dist/τ))  "soft"

With mixup or cutmix the teacher sees the same mixed images as the student. At inference the student
answers with the mean of its two heads (`vit.nn.vision.DistilledVisionTransformer`).

`DistilledClassifier` is the task: an `ImageClassifier` whose student has the dist token and second head, and
whose training loss adds the teacher's (configs/distill_small.yaml). The teacher is a `vit fit` checkpoint (a ViT
of any family, or a timm convnet that `configs/teacher_small.yaml` trained), or a timm model name with a weights
file. `Teacher` holds it outside the module tree: Lightning moves
and casts it with the student (``_apply``), on every DDP rank, but it is no parameter of the student, so it is
in no optimiser, no DDP gradient bucket and no saved state dict.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from vit.checkpoints.io import missing_message, newest_checkpoint, read_checkpoint
from vit.checkpoints.meta import META_KEY, evaluated_weights
from vit.checkpoints.runs import run_checkpoint_folders
from vit.deploy.classifier import read_classifier
from vit.errors import UserPathError, UserValueError
from vit.tasks.backbones import ViTBackbone
from vit.tasks.classify import ImageClassifier

log = logging.getLogger(__name__)

MODES = ("hard", "soft")


# ---- the losses ------------------------------------------------------------------------------
def hard_distillation(base: Tensor, dist_logits: Tensor, teacher_logits: Tensor, alpha: float) -> Tensor:
    """(1-α)·``base`` + α·CE(dist head, the teacher's top class): DeiT's hard distillation. ``base`` is the
    classification loss of the cls head (label-smoothed, or mixup's soft targets)."""
    return (1 - alpha) * base + alpha * F.cross_entropy(dist_logits, teacher_logits.argmax(dim=-1))


def soft_distillation(base: Tensor, dist_logits: Tensor, teacher_logits: Tensor, alpha: float, tau: float) -> Tensor:
    """(1-α)·``base`` + α·τ²·KL(softmax(teacher/τ) ‖ softmax(dist/τ)), the KL summed over classes and averaged
    over the batch (Hinton et al., 2015). DeiT's own code divides the sum by batch x classes instead, which is
    this with α smaller by the class count."""
    kl = F.kl_div(F.log_softmax(dist_logits.float() / tau, dim=-1), F.log_softmax(teacher_logits.float() / tau, dim=-1),
                  reduction="batchmean", log_target=True)
    return (1 - alpha) * base + alpha * tau**2 * kl


def check_options(distillation: str, alpha: float, tau: float) -> None:
    """A clear error for a distillation setting that cannot work."""
    if distillation not in MODES:
        raise UserValueError(f"distillation must be one of {', '.join(MODES)}, got {distillation!r}")
    if not 0 <= alpha <= 1:
        raise UserValueError(f"distill_alpha weighs the teacher's loss against the labels': 0 to 1, got {alpha}")
    if not tau > 0:
        raise UserValueError(f"distill_tau (the softmax temperature) must be > 0, got {tau}")


# ---- the task -------------------------------------------------------------------------------
class DistilledClassifier(ImageClassifier):
    """An `ImageClassifier` that learns from a teacher as well as from the labels (DeiT): its ViT student gets the
    dist token and second head, which learns from the teacher; inference answers with the mean of the two heads.

    Args:
        distillation: "hard" (the dist head learns the teacher's top class) or "soft" (its softened probabilities).
        teacher: a `vit fit` checkpoint (any ViT family, or a timm convnet from configs/teacher_small.yaml), or
            "best" / "last" of ``teacher_dir``; with ``teacher_weights``, a timm model name. Read when fitting starts.
        teacher_weights: the weights of the timm model ``teacher`` names (.safetensors, .pth or a checkpoint).
        teacher_dir: the teacher run's checkpoint folder, where ``teacher: best`` looks.
        distill_alpha: the weight of the teacher's loss; 1 - alpha is the labels'.
        distill_tau: the softmax temperature of soft distillation.
        **kwargs: the `ImageClassifier` options (``model``, ``head``, ``optim``, ...).
    """

    def __init__(self, distillation: str = "soft", teacher: str | None = None, teacher_weights: str | None = None,
                 teacher_dir: str | None = None, distill_alpha: float = 0.5, distill_tau: float = 1.0,
                 **kwargs: Any) -> None:
        check_options(distillation, distill_alpha, distill_tau)
        super().__init__(**kwargs)

    def build_network(self) -> nn.Module:
        """The ViT student with DeiT's dist token and ``head_dist``, training on both heads' logits."""
        if not isinstance(self.backbone, ViTBackbone):
            raise UserValueError(f"distillation gives the student DeiT's dist token and second head: a ViT "
                                 f"(backbone: vit), not backbone: {self.hparams.backbone}")
        network = self.create_vit(self.hparams.num_classes, distilled=True)
        network.distilled_training = True  # training returns (cls logits, dist logits)
        self.teacher: Teacher | None = None  # read in setup("fit")
        return network

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if stage == "fit" and self.teacher is None:
            # Here, before Lightning moves the module to its device: the teacher follows it there, on every rank.
            self.teacher = load_teacher(hp.teacher, weights=hp.teacher_weights, folder=hp.teacher_dir,
                                        num_classes=hp.num_classes, in_chans=self.model.in_chans,
                                        class_names=self.class_names, mean=self.mean, std=self.std)
            rank_zero_info(f"distillation: {hp.distillation} (alpha {hp.distill_alpha}, tau {hp.distill_tau}) "
                           f"from the teacher {self.teacher.source}")
        super().setup(stage)

    def loss_and_logits(self, x: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """(loss, logits): the labels' loss on the cls head and the teacher's on the dist head (the teacher sees
        the same, possibly mixed, images); the logits are what inference answers, the heads' mean."""
        if self.teacher is None:  # a step outside fit: the labels' loss alone
            logits = self.model(x)
            return self.train_loss(logits, targets), logits
        cls, dist = self.model(x)
        base, teacher = self.train_loss(cls, targets), self.teacher(x)
        hp = self.hparams
        if hp.distillation == "hard":
            loss = hard_distillation(base, dist, teacher, hp.distill_alpha)
        else:
            loss = soft_distillation(base, dist, teacher, hp.distill_alpha, hp.distill_tau)
        return loss, (cls + dist) / 2

    def on_train_start(self) -> None:
        self.epoch_started = time.perf_counter()  # a run resumed mid-epoch starts no epoch

    def on_train_epoch_start(self) -> None:
        self.epoch_started = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        if self.teacher is not None:  # the teacher's share of the epoch, and of a step (teacher_ms in the logs)
            ms, line = self.teacher.report(time.perf_counter() - self.epoch_started)
            self.log("teacher_ms", ms, sync_dist=True)
            rank_zero_info(f"epoch {self.current_epoch}: {line}")

    def checkpoint_meta(self) -> dict[str, Any]:
        """The classifier's record, and the teacher it learnt from."""
        meta = super().checkpoint_meta()
        return {**meta, "teacher": self.teacher.source} if self.teacher is not None else meta


# ---- timing ----------------------------------------------------------------------------------
class Stopwatch:
    """Time spent in a block, summed; on a GPU by CUDA events, read (and synchronised) only when asked."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0
        self._events: list[tuple[Any, Any]] = []

    @contextmanager
    def time(self, device: torch.device) -> Iterator[None]:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
        else:
            started = time.perf_counter()
            yield
            self.seconds += time.perf_counter() - started
        self.calls += 1

    def take(self) -> tuple[float, int]:
        """(seconds, calls) since the last call, and start again."""
        if self._events:
            self._events[-1][1].synchronize()
            self.seconds += sum(start.elapsed_time(end) for start, end in self._events) / 1000
        taken = (self.seconds, self.calls)
        self.seconds, self.calls, self._events = 0.0, 0, []
        return taken


# ---- the teacher -----------------------------------------------------------------------------
class Teacher(nn.Module):
    """A frozen network in eval mode, with the input the student gets translated to its own preparation.

    The network is held outside the module tree, so ``parameters()`` and ``state_dict()`` never see it; `_apply`
    (which ``.to()``, ``.cuda()``, ``.half()`` and Lightning's moves and precision casts go through, as torchmetrics'
    metrics use it) takes it along. Its forward runs without gradients and is timed (``stopwatch``).
    """

    def __init__(self, network: nn.Module, source: str, class_names: Sequence[str] | None,
                 img_size: tuple[int, int] | None = None, renormalise: tuple[Tensor, Tensor] | None = None,
                 interpolation: str = "bicubic") -> None:
        super().__init__()
        network.eval().requires_grad_(False)
        self.__dict__["network"] = network  # not registered: see the class docstring
        self.source, self.class_names = source, list(class_names) if class_names is not None else None
        self.img_size, self.interpolation = img_size, interpolation
        self.stopwatch = Stopwatch()
        scale, shift = renormalise if renormalise is not None else (torch.ones(0), torch.zeros(0))
        # Non-persistent buffers: moved and cast with the module, not saved.
        self.register_buffer("scale", scale.view(1, -1, 1, 1) if scale.numel() else scale, persistent=False)
        self.register_buffer("shift", shift.view(1, -1, 1, 1) if shift.numel() else shift, persistent=False)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Teacher:
        self.network._apply(fn)
        return super()._apply(fn, recurse)

    def train(self, mode: bool = True) -> Teacher:
        super().train(mode)
        self.network.eval()  # always: its BatchNorm statistics and dropout stay as they were trained
        return self

    def report(self, epoch_seconds: float) -> tuple[float, str]:
        """(ms a step, a sentence) of the teacher's forward since the last report, against the epoch's time."""
        seconds, calls = self.stopwatch.take()
        ms = 1000 * seconds / max(calls, 1)
        share = seconds / epoch_seconds if epoch_seconds > 0 else 0.0
        return ms, (f"the teacher's forward took {seconds:.1f} s of the epoch's {epoch_seconds:.1f} s ({share:.0%}), "
                    f"{ms:.1f} ms a step")

    @torch.no_grad()
    def forward(self, images: Tensor) -> Tensor:
        """The teacher's logits (B, K) for the student's (normalised) images."""
        with self.stopwatch.time(images.device):
            if self.img_size is not None and tuple(images.shape[-2:]) != tuple(self.img_size):
                images = F.interpolate(images, size=self.img_size, mode=self.interpolation, align_corners=False)
            if self.scale.numel():
                images = images * self.scale + self.shift
            return self.network(images)


def resolve(teacher: str, folder: str | None) -> Path:
    """The teacher checkpoint ``teacher`` names: a path, or "best"/"last" of ``folder`` (the latest run's best
    checkpoint, or the newest last.ckpt, as ``--ckpt_path best|last`` finds it)."""
    if teacher in ("best", "last"):
        if folder is None:
            raise UserValueError(f"teacher: {teacher} needs teacher_dir, the teacher run's checkpoint folder "
                                 "(configs/teacher_small.yaml writes logs/teacher_small/checkpoints)")
        # the folder itself, or a run folder Lightning wrote: its checkpoints/, or <version>/checkpoints/, newest first
        for candidate in (Path(folder), Path(folder) / "checkpoints", *run_checkpoint_folders(folder)):
            if (found := newest_checkpoint(candidate, teacher)) is not None:
                return found
        raise UserPathError(f"teacher: {teacher}: no {teacher}*.ckpt in {folder} (nor in a checkpoints/ folder "
                            "below it). Train the teacher first: vit fit --config configs/teacher_small.yaml "
                            "--data.init_args.root YOUR_FOLDER (or give teacher: PATH.ckpt)")
    if not Path(teacher).exists():
        raise UserPathError("teacher: " + missing_message(teacher, [folder] if folder else []))
    return Path(teacher)


def load_teacher(
    teacher: str | None, *, weights: str | None = None, folder: str | None = None, num_classes: int, in_chans: int,
    class_names: Sequence[str], mean: Sequence[float], std: Sequence[float],
) -> Teacher:
    """The frozen `Teacher` for a student with these classes and this input preparation.

    ``teacher``: a `vit fit` checkpoint (or "best"/"last" of ``folder``); with ``weights``, a timm model name and
    its weights (.safetensors, a torch state dict, or a `vit fit` checkpoint of that timm model).
    """
    if teacher is None:
        raise UserValueError("distillation needs a teacher: model.init_args.teacher PATH.ckpt (a `vit fit` "
                             "checkpoint), or a timm model name with model.init_args.teacher_weights FILE")
    if weights is not None:
        network, names = timm_network(teacher, weights, num_classes, in_chans)
        source, size, interpolation, renorm = f"{teacher} ({weights})", None, "bicubic", None
    else:
        path = resolve(teacher, folder)
        classifier = read_classifier(path)
        network, names, source = classifier.model, classifier.class_names, str(path)
        size, interpolation = tuple(classifier.img_size), classifier.interpolation
        if classifier.in_chans != in_chans:
            raise UserValueError(f"the teacher {path} takes {classifier.in_chans}-channel images, this run's data "
                                 f"has {in_chans}: train the teacher on this data (configs/teacher_small.yaml)")
        renorm = translation(mean, std, classifier.mean, classifier.std)
    check_classes(names, class_names, num_classes, source)
    log.info("teacher: %s", source)
    return Teacher(network, source, names, size, renorm, interpolation)


def translation(mean: Sequence[float], std: Sequence[float], t_mean: Sequence[float], t_std: Sequence[float]
                ) -> tuple[Tensor, Tensor] | None:
    """(scale, shift) that turn images normalised by (mean, std) into images normalised the teacher's way."""
    mean, std, t_mean, t_std = (torch.tensor(list(v), dtype=torch.float32) for v in (mean, std, t_mean, t_std))
    if torch.allclose(mean, t_mean) and torch.allclose(std, t_std):
        return None
    return std / t_std, (mean - t_mean) / t_std  # x_t = (x * std + mean - t_mean) / t_std


def check_classes(teacher: Sequence[str] | None, student: Sequence[str], num_classes: int, source: str) -> None:
    """The teacher must know this run's classes, by name and in the same order (deit #124), else it teaches
    one class's answer for another."""
    if teacher is None:  # a bare weights file: only its head's size was checked
        log.info("teacher %s names no classes: only their number (%d) is checked", source, num_classes)
        return
    if list(teacher) == list(student):
        return
    lacks, extra = sorted(set(student) - set(teacher)), sorted(set(teacher) - set(student))
    why = "the same names in another order" if not lacks and not extra else \
        f"the teacher lacks {lacks}, the data lacks {extra}"
    raise UserValueError(
        f"the teacher {source} was trained on the classes {list(teacher)}, this run's data has {list(student)} "
        f"({why}). Its answers would teach the wrong classes: train the teacher on this folder "
        "(vit fit --config configs/teacher_small.yaml --data.init_args.root YOUR_FOLDER)")


def timm_network(name: str, weights: str, num_classes: int, in_chans: int) -> tuple[nn.Module, list[str] | None]:
    """timm model ``name`` with the weights in ``weights`` (all keys, all shapes), and its class names if known."""
    import timm

    if not timm.is_model(name):
        raise UserValueError(f"teacher {name!r} with teacher_weights is a timm model name, but timm has no such model "
                             "(timm.list_models() lists them); without teacher_weights, give a `vit fit` checkpoint")
    path = Path(weights)
    if not path.is_file():
        raise UserPathError(f"teacher_weights: no file {path}")
    names = None
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = read_checkpoint(path)
        meta = state.get(META_KEY)
        if isinstance(meta, dict):  # a `vit fit` checkpoint: its evaluated weights and classes
            names = meta.get("class_names")
            state = evaluated_weights(state["state_dict"], meta.get("ema", False))
        state = state.get("state_dict", state.get("model", state))
    network = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_chans)
    own = network.state_dict()
    missing, unexpected = [k for k in own if k not in state], [k for k in state if k not in own]
    wrong = [k for k, v in own.items() if k in state and state[k].shape != v.shape]
    if missing or unexpected or wrong:
        raise UserValueError(f"teacher_weights {path} do not fit timm's {name} with {num_classes} classes and "
                             f"{in_chans} channels: missing {missing[:5]}, unexpected {unexpected[:5]}, "
                             f"mis-shaped {wrong[:5]}")
    network.load_state_dict(state)
    return network, names


__all__ = ["MODES", "DistilledClassifier", "Stopwatch", "Teacher", "check_classes", "hard_distillation", "load_teacher",
           "soft_distillation"]
