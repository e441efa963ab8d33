"""Knowledge distillation (DeiT, Touvron et al., 2021): the teacher a student learns from, and the two losses.

    images (B, C, H, W) ─┬─► student ─► cls head (B, K) ──► (1-α)·CE(cls, y)
                         │           └► dist head (B, K) ─┐
                         └─► Teacher (frozen) ─► (B, K) ──┴► α·CE(dist, argmax teacher)           "hard"
                                                             α·τ²·KL(softmax(t/τ) ‖ softmax(dist/τ))  "soft"

With mixup or cutmix the teacher sees the same mixed images as the student. At inference the student
answers with the mean of its two heads (`vit.nn.vision.DistilledVisionTransformer`).

The teacher is a `vit fit` checkpoint (a ViT of any family, or a timm convnet that `configs/teacher_small.yaml`
trained), or a timm model name with a weights file. `Teacher` holds it outside the module tree: Lightning moves
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
from torch import Tensor, nn

from vit.checkpoints.io import missing_message, newest_checkpoint, read_checkpoint
from vit.checkpoints.meta import evaluated_weights
from vit.checkpoints.runs import run_checkpoint_folders
from vit.deploy.classifier import read_classifier
from vit.errors import UserPathError, UserValueError

log = logging.getLogger(__name__)

MODES = ("none", "hard", "soft")


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
        if isinstance(state.get("vit"), dict):  # a `vit fit` checkpoint: its evaluated weights and classes
            names = state["vit"].get("class_names")
            state = evaluated_weights(state["state_dict"], state["vit"].get("ema", False))
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


__all__ = ["MODES", "Stopwatch", "Teacher", "check_classes", "hard_distillation", "load_teacher",
           "soft_distillation"]
