"""Several labels per image: mixing multi-hot targets, the per-class thresholds chosen on val, and the evaluation
(`MultiLabelEvaluation`, the head's: `vit.tasks.evaluation`).

Targets are float (B, C): 1 the label applies, 0 it does not, -1 unknown (left out of the loss and the metrics).

    logits (B, C) ─► sigmoid ─► probabilities ─► LabelScores (every val/test image, synced across DDP ranks)
                                                     │
                val: thresholds = F1-optimal cut per class (`choose_thresholds`) ─► checkpoint["vit"]["thresholds"]
                test: mAP, F1 at those thresholds, exact-set accuracy, Hamming loss, per-class AP, figures

Under DDP, Lightning's DistributedSampler pads the last shards with images from the start, so that every rank gets
as many; `LabelScores` gathers every rank's scores and drops the padding, so no image counts twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DistributedSampler
from torchmetrics import Metric
from torchmetrics.functional.classification import (
    multilabel_average_precision,
    multilabel_exact_match,
    multilabel_f1_score,
    multilabel_hamming_distance,
)
from torchmetrics.utilities import dim_zero_cat

from vit._graveyard import moved_name
from vit.checkpoints.meta import label_meta, label_thresholds
from vit.tasks.evaluation import Evaluation, Run

DEFAULT_THRESHOLD = 0.5


# ---- mixing ---------------------------------------------------------------------------------------
def mix_targets(targets: Tensor, lam: float) -> Tensor:
    """Each image's targets mixed with its mirror's in the batch (``flip(0)``, as the images are): lam x own +
    (1 - lam) x other; a label unknown on either side stays unknown (-1)."""
    other = targets.flip(0)
    mixed = lam * targets + (1 - lam) * other
    return torch.where((targets < 0) | (other < 0), torch.full_like(mixed, -1.0), mixed)


@dataclass(frozen=True)
class MultiLabelMixup:
    """Mixup or cutmix of a batch and its multi-hot targets, as timm's ``Mixup`` pairs images (each with its mirror
    in the batch; an odd batch's middle image is mixed with itself). Cutmix's lam is the share of the image kept."""

    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    prob: float = 1.0
    switch_prob: float = 0.5

    def __call__(self, images: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        if torch.rand(()).item() >= self.prob:
            return images, targets
        cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha <= 0 or torch.rand(()).item() < self.switch_prob)
        alpha = self.cutmix_alpha if cutmix else self.mixup_alpha
        lam = torch.distributions.Beta(alpha, alpha).sample().item()
        other = images.flip(0)
        if cutmix:
            from timm.data.mixup import cutmix_bbox_and_lam

            (y0, y1, x0, x1), lam = cutmix_bbox_and_lam(images.shape, lam, correct_lam=True)
            images = images.clone()
            images[:, :, y0:y1, x0:x1] = other[:, :, y0:y1, x0:x1]
        else:
            images = images * lam + other * (1 - lam)
        return images, mix_targets(targets, lam)


# ---- thresholds -----------------------------------------------------------------------------------
def choose_thresholds(probs: Tensor, targets: Tensor, min_positives: int = 5,
                      default: float = DEFAULT_THRESHOLD) -> Tensor:
    """Each class's cut (C,), chosen on (N, C) probabilities and 0/1/-1 targets: the count k of top-scored images
    called positive that maximises F1 (the largest k among ties), cut midway between the k-th score and the next
    lower one (0 below the last). A class with fewer than ``min_positives`` known positives is too rare to tune
    and keeps ``default``."""
    cuts = torch.full((probs.shape[1],), float(default))
    for c in range(probs.shape[1]):
        known = targets[:, c] >= 0
        p, y = probs[known, c].float(), (targets[known, c] > 0.5).float()
        if y.sum() < min_positives:
            continue
        p, order = p.sort(descending=True)
        tp = y[order].cumsum(0)
        k = torch.arange(1, len(p) + 1, dtype=torch.float32)
        f1 = 2 * tp / (k + y.sum())  # 2TP / (2TP + FP + FN), FP + TP = k, FN + TP = positives
        f1[:-1][p[:-1] == p[1:]] = -1  # a cut between equal scores does not exist
        best = int((f1 == f1.max()).nonzero().max())
        lower = p[best + 1].item() if best + 1 < len(p) else 0.0
        cuts[c] = (p[best].item() + lower) / 2
    return cuts


# ---- the scores of every image, once -------------------------------------------------------------
class LabelScores(Metric):
    """Every image's probabilities and targets over an epoch, gathered from all DDP ranks by torchmetrics, without
    the images the DistributedSampler repeated to even out the shards (`set_sampler`). `compute` gives them in
    the dataset's order."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("probs", default=[], dist_reduce_fx="cat")
        self.add_state("targets", default=[], dist_reduce_fx="cat")
        self.shares: tuple[int, int] | None = None  # (dataset size, ranks) of an unshuffled DistributedSampler

    def set_sampler(self, sampler: Any) -> None:
        """Note how a DistributedSampler split the dataset (anything else: nothing to undo)."""
        distributed = isinstance(sampler, DistributedSampler) and sampler.num_replicas > 1 and not sampler.shuffle
        self.shares = (len(sampler.dataset), sampler.num_replicas) if distributed else None
        self._computed = None  # torchmetrics caches what compute gave

    def update(self, probs: Tensor, targets: Tensor) -> None:
        self.probs.append(probs.detach().float())
        self.targets.append(targets.detach().float())

    def compute(self) -> tuple[Tensor, Tensor]:
        probs, targets = dim_zero_cat(self.probs), dim_zero_cat(self.targets)
        if self.shares is None or len(probs) % self.shares[1]:
            return probs, targets
        size, ranks = self.shares
        # rank r's j-th image is the dataset's r + j x ranks; past the end, the sampler's padding
        per_rank = len(probs) // ranks
        index = (torch.arange(ranks)[:, None] + torch.arange(per_rank)[None, :] * ranks).flatten()
        keep = (index < size).nonzero().squeeze(1)
        order = keep[index[keep].argsort()]
        return probs[order], targets[order]


def label_metrics(probs: Tensor, targets: Tensor, thresholds: Tensor, *, test: bool = False) -> dict[str, Tensor]:
    """Macro mAP, micro and macro F1 at ``thresholds``; for ``test`` also exact-set accuracy and Hamming loss (a
    label that is unknown is left out of each)."""
    n, labels = probs.shape[1], targets.long()
    decided = (probs >= thresholds.to(probs.device)).long()  # integer predictions: torchmetrics uses them as given
    scores = {
        "map": multilabel_average_precision(probs, labels, n, average="macro", ignore_index=-1),
        "f1_micro": multilabel_f1_score(decided, labels, n, average="micro", ignore_index=-1),
        "f1_macro": multilabel_f1_score(decided, labels, n, average="macro", ignore_index=-1),
    }
    if test:
        scores["exact_match"] = multilabel_exact_match(decided, labels, n, ignore_index=-1)
        scores["hamming_loss"] = multilabel_hamming_distance(decided, labels, n, average="micro", ignore_index=-1)
    return scores


def class_ap(probs: Tensor, targets: Tensor) -> Tensor:
    """Each class's average precision (C,); NaN for a class without a known positive."""
    labels = targets.long()
    ap = multilabel_average_precision(probs, labels, probs.shape[1], average=None, ignore_index=-1)
    return ap.masked_fill((labels == 1).sum(0) == 0, float("nan"))


class MultiLabelEvaluation(Evaluation):
    """What a multi-label classifier's validation and test keep: every image's scores (`LabelScores`), the
    thresholds chosen on val (the checkpoint's), and the test's worst false positives and negatives per class."""

    def __init__(self, num_classes: int, min_positives: int = 5) -> None:
        super().__init__()
        self.min_positives = min_positives
        self.scores = nn.ModuleDict({"val": LabelScores(), "test": LabelScores()})
        self.thresholds = torch.full((num_classes,), DEFAULT_THRESHOLD)
        self.mistakes = LabelMistakes(num_classes)

    def start(self, stage: str, loaders: Any) -> None:
        """At an epoch's start: how the sampler of ``loaders`` (a trainer's val or test loaders) split the data."""
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        self.scores[stage].set_sampler(getattr(loader, "sampler", None))

    @torch.no_grad()
    def step(self, stage: str, images: Tensor, logits: Tensor, targets: Tensor) -> Mapping[str, Any]:
        """One batch's probabilities and targets (and, in test, its mistakes); nothing to log before the epoch ends."""
        probs = logits.float().sigmoid()
        self.scores[stage].update(probs, targets)
        if stage == "test":
            self.mistakes.update(images, probs, targets, self.thresholds)
        return {}

    def end(self, stage: str, run: Run) -> dict[str, float]:
        """The epoch's metrics (``val_map``, ...) on every image at once: after val, with the thresholds chosen on
        these scores (unless ``run`` is Lightning's sanity check); after test, with the report (`label_report`)."""
        probs, targets = self.scores[stage].compute()
        self.scores[stage].reset()
        if stage == "val" and run.counted:  # the thresholds of the val epoch a checkpoint is saved after
            self.thresholds = choose_thresholds(probs.cpu(), targets.cpu(), self.min_positives)
        values = label_metrics(probs, targets, self.thresholds, test=stage == "test")
        if stage == "test":
            label_report(run, probs.cpu(), targets.cpu(), self.thresholds, self.mistakes)
            self.mistakes.reset()
        return {f"{stage}_{k}": float(v) for k, v in values.items()}

    def checkpoint_meta(self) -> dict[str, Any]:
        """The multi-label flag and the thresholds chosen on val."""
        return label_meta(self.thresholds.tolist())

    def load_meta(self, meta: Mapping[str, Any]) -> None:
        """The thresholds a checkpoint holds."""
        if (thresholds := label_thresholds(meta)) is not None:
            self.thresholds = torch.tensor(thresholds, dtype=torch.float32)


# ---- the false positives and negatives the gallery shows ------------------------------------------
class LabelMistakes:
    """Per class, the test image most confidently called positive while negative (FP) and the one scored lowest
    while positive (FN), kept as the batches stream by (on the CPU; rank 0's shard under DDP)."""

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.reset()

    def reset(self) -> None:
        """Forget what was kept."""
        self.kept: dict[tuple[str, int], tuple[float, Tensor, Tensor, Tensor]] = {}

    @torch.no_grad()
    def update(self, images: Tensor, probs: Tensor, targets: Tensor, thresholds: Tensor) -> None:
        """Keep this batch's worst FP and FN per class when they beat those kept."""
        cut = thresholds.to(probs.device)
        for kind, wrong, badness in (("FP", (targets == 0) & (probs >= cut), probs),
                                     ("FN", (targets == 1) & (probs < cut), 1 - probs)):
            for c in wrong.any(0).nonzero().flatten().tolist():
                i = int(torch.where(wrong[:, c], badness[:, c], -1.0).argmax())
                if badness[i, c] > self.kept.get((kind, c), (-1.0,))[0]:
                    self.kept[(kind, c)] = (float(badness[i, c]), images[i].float().cpu(), probs[i].cpu(),
                                            targets[i].cpu())

    def items(self) -> list[tuple[str, int, Tensor | None, Tensor | None, Tensor | None]]:
        """(kind, class, image, probabilities, targets), class by class, FP before FN: both for every class with
        either (the one it lacks as Nones, so the gallery keeps FP and FN in their columns)."""
        shown = [c for c in range(self.num_classes) if ("FP", c) in self.kept or ("FN", c) in self.kept]
        return [(kind, c, *self.kept.get((kind, c), (None, None, None, None))[1:]) for c in shown
                for kind in ("FP", "FN")]


def save_label_report(probs: Tensor, targets: Tensor, thresholds: Tensor, mistakes: LabelMistakes,
                      class_names: Sequence[str], mean: Sequence[float], std: Sequence[float],
                      out_dir: str | Path) -> dict[str, Any]:
    """Write class_ap.png (per-class AP beside the PR curves of the worst classes), label_cooccurrence.png and
    label_errors.png (each class's worst FP and FN) to ``out_dir``; returns the figures by name, for loggers."""
    from vit.explain import to_display_image
    from vit.reports import class_ap_figure, cooccurrence_figure, label_errors_figure, save_figure

    names = list(class_names)
    figures = {"class_ap": class_ap_figure(probs, targets, class_ap(probs, targets), names),
               "label_cooccurrence": cooccurrence_figure(targets, names)}
    if shown := mistakes.items():
        images = [None if image is None else to_display_image(image, mean, std, min_side=64)
                  for _, _, image, _, _ in shown]
        captions = [caption(kind, c, p, t, thresholds, names) if image is not None else f"{kind} {names[c]}: none"
                    for (kind, c, image, p, t) in shown]
        figures["label_errors"] = label_errors_figure(images, captions)
    for name, fig in figures.items():
        save_figure(fig, Path(out_dir) / f"{name}.png")
    return figures


def caption(kind: str, c: int, probs: Tensor, targets: Tensor, thresholds: Tensor, names: Sequence[str]) -> str:
    """``FP cat 0.93`` and the image's true and predicted labels."""
    true = [names[i] for i in (targets == 1).nonzero().flatten().tolist()]
    said = [names[i] for i in (probs >= thresholds).nonzero().flatten().tolist()]
    return f"{kind} {names[c]} {probs[c]:.2f}\ntrue {', '.join(true) or '-'}\nsaid {', '.join(said) or '-'}"


def label_report(run: Run, probs: Tensor, targets: Tensor, thresholds: Tensor, mistakes: LabelMistakes) -> None:
    """A multi-label classifier's test figures in its run folder (rank 0): per-class AP, label co-occurrence and
    each class's worst false positive and negative, logged to its loggers too."""
    from lightning.pytorch.utilities import rank_zero_info

    from vit.tasks.mistakes import log_figures

    if run.out_dir is None or not run.is_global_zero:
        return
    figures = save_label_report(probs, targets, thresholds, mistakes, run.class_names, run.mean, run.std, run.out_dir)
    log_figures(run.loggers, figures, run.step)
    rank_zero_info(f"per-class AP, label co-occurrence and each class's worst false positive and negative "
                   f"saved to {run.out_dir} ({', '.join(name + '.png' for name in figures)})")


__all__ = ["LabelMistakes", "LabelScores", "MultiLabelEvaluation", "MultiLabelMixup", "choose_thresholds", "class_ap",
           "label_metrics", "label_report", "mix_targets", "save_label_report"]


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # 0.1's LabelEvaluation, label_test_report (vit/_graveyard.py)
