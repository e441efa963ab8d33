"""A temperature per class for a multi-label checkpoint (a sigmoid per class, cut at per-class thresholds chosen on
val): what `vit calibrate` and the end of `vit fit` fit for one, in place of the single-label softmax T and unknown
score of `vit.deploy.calibration`.

- T_c > 0 minimises the binary cross-entropy of sigmoid(z_c / T_c) on the validation logits (one LBFGS on log T over
  every class: the loss is a sum of one term per class, so each T_c is its own class's minimum). A class whose known
  val labels are all one outcome, or all on the right side of z = 0 (the BCE then falls as T -> 0, with no
  minimum), keeps T_c = 1. A class with fewer than 5 wrong val labels has too few to set its own T: it takes one
  T fit on the pooled labels of every class with a minimum.
- The thresholds t_c were chosen on sigmoid(z_c); the same cut on sigmoid(z_c / T_c) is sigmoid(logit(t_c) / T_c),
  so every image keeps its set of labels (checked on val before anything is stored).
- No "unknown" score: an image with no label over its threshold already answers "none of these" (no labels).
- The figures, before and after, on the known val labels: per-class ECE (torchmetrics' BinaryCalibrationError, 15
  bins) averaged over the classes, BCE (NLL) and Brier score over every known (image, class) pair.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from vit.deploy.classifier import Classifier
from vit.deploy.confidence import Calibration, Confidence
from vit.deploy.inference import label_answers
from vit.errors import UserValueError
from vit.progress import progress

ECE_BINS = 15
MIN_MISTAKES = 5  # wrong val labels a class needs for a T of its own; fewer: the T every class shares
NO_UNKNOWN = ("no \"unknown\" score for a multi-label model: an image with no label over its threshold already "
              "answers \"none of these\" (an empty label set)")


def mistakes(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """(C,) each: whether a class's BCE in T has a minimum (val holds both outcomes among the known labels, and some
    known label on the wrong side of z = 0; else the loss falls as T -> 0), and its count of such wrong labels."""
    known = targets >= 0
    positive, negative = known & (targets == 1), known & (targets == 0)
    wrong = ((positive & (logits <= 0)) | (negative & (logits >= 0))).sum(0)
    return positive.any(0) & negative.any(0) & (wrong > 0), wrong


def temperature_groups(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(C,) bool each: the classes whose BCE has a minimum (they make the shared T's pool), those with a T of their
    own (at least `MIN_MISTAKES` wrong labels), and those that take the shared T (fewer, the pool holding enough);
    the rest keep T = 1."""
    has_minimum, wrong = mistakes(logits, targets)
    own = has_minimum & (wrong >= MIN_MISTAKES)
    return has_minimum, own, has_minimum & ~own & bool(wrong[has_minimum].sum() >= MIN_MISTAKES)


def fit_label_temperatures(logits: Tensor, targets: Tensor) -> list[float]:
    """T_c for each class, minimising the mean BCE of sigmoid(z_c / T_c) over its known val labels (targets 1 / 0;
    -1 is unknown and left out), from T = 1. A class with a minimum but fewer than `MIN_MISTAKES` wrong labels
    takes one T shared by every class with a minimum, their pooled labels' (one barely wrong label set a 20-image
    class's own T to 0.014); 1 where there is no minimum, or the pool holds fewer than `MIN_MISTAKES` mistakes."""
    logits, targets = logits.double(), targets.double()
    known = (targets >= 0).double()
    has_minimum, own, takes_shared = temperature_groups(logits, targets)
    shared = bool(takes_shared.any())
    if not bool(own.any()) and not shared:
        return [1.0] * logits.shape[1]
    log_t = torch.zeros(logits.shape[1] + 1, dtype=torch.float64, requires_grad=True)  # the last: the shared T
    optimizer = torch.optim.LBFGS([log_t], lr=0.1, max_iter=500, line_search_fn="strong_wolfe",
                                  tolerance_grad=1e-10, tolerance_change=1e-12)
    labels = targets.clamp_min(0)

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(logits / log_t[:-1].exp(), labels, reduction="none") * known
        total = (loss.sum(0) / known.sum(0).clamp_min(1))[own].sum()  # a sum of per-class means: each T_c alone
        if shared:  # and the pooled mean of every class with a minimum, at the one shared T
            pool = F.binary_cross_entropy_with_logits(logits / log_t[-1].exp(), labels, reduction="none") * known
            total = total + pool[:, has_minimum].sum() / known[:, has_minimum].sum()
        total.backward()
        return total

    optimizer.step(closure)
    found = log_t.detach().exp()
    return torch.where(own, found[:-1], torch.where(takes_shared, found[-1], torch.ones_like(found[:-1]))).tolist()


def moved_thresholds(thresholds: list[float], temperatures: list[float]) -> list[float]:
    """The cut on sigmoid(z / T_c) that ``thresholds`` (cuts on sigmoid(z)) were: sigmoid(logit(t_c) / T_c)."""
    t = torch.tensor(thresholds, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    return (torch.logit(t) / torch.tensor(temperatures, dtype=torch.float64)).sigmoid().tolist()


def label_figures(logits: Tensor, targets: Tensor, temperatures: list[float] | None = None) -> dict[str, Any]:
    """Per-class ECE (15 bins, L1, torchmetrics) over each class's known labels and their mean over the classes
    with any; the BCE (NLL) and Brier score over every known (image, class) pair; of sigmoid(z / T_c)."""
    from torchmetrics.functional.classification import binary_calibration_error

    t = torch.tensor(temperatures or [1.0] * logits.shape[1], dtype=torch.float64)
    scaled, targets = logits.double() / t, targets.double()
    probs, known = scaled.sigmoid(), targets >= 0
    eces = [float(binary_calibration_error(probs[known[:, c], c].float(), targets[known[:, c], c].long(),
                                           n_bins=ECE_BINS, norm="l1")) if known[:, c].any() else None
            for c in range(logits.shape[1])]
    measured = [e for e in eces if e is not None]
    bce = F.binary_cross_entropy_with_logits(scaled[known], targets[known])
    return {"ece": sum(measured) / max(len(measured), 1), "ece_per_class": eces, "nll": float(bce),
            "brier": float(((probs[known] - targets[known]) ** 2).mean())}


def pooled_bins(logits: Tensor, targets: Tensor, temperatures: list[float] | None = None,
                bins: int = ECE_BINS) -> dict[str, list[float]]:
    """The reliability diagram's numbers over every known (image, class) pair, pooled: per probability bin (equal
    widths), the mean sigmoid(z / T_c), the share of positives and the pair count; empty bins left out."""
    t = torch.tensor(temperatures or [1.0] * logits.shape[1], dtype=torch.float64)
    known = targets >= 0
    probs, truth = (logits.double() / t).sigmoid()[known], targets.double()[known]
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64)
    which = (torch.bucketize(probs, edges, right=True) - 1).clamp(0, bins - 1)
    count = torch.bincount(which, minlength=bins)
    used = count > 0

    def mean(values: Tensor) -> list[float]:
        return (torch.zeros(bins, dtype=torch.float64).index_add_(0, which, values)[used] / count[used]).tolist()

    return {"confidence": mean(probs), "accuracy": mean(truth), "count": count[used].tolist()}


def label_sets(logits: Tensor, thresholds: list[float], calibration: Calibration | None = None) -> list[list[int]]:
    """Each image's labels as `vit predict` answers them (`label_answers`), with or without ``calibration``."""
    answers = label_answers(logits, thresholds, 1, [str(i) for i in range(logits.shape[1])], calibration)
    return [sorted(e["class"] for e in said["labels"]) for _, said in answers]


@torch.no_grad()
def val_logits(classifier: Classifier, val: Dataset, batch_size: int = 256,
               num_workers: int = 0) -> tuple[Tensor, Tensor]:
    """The logits (N, C) and targets (N, C) (1 / 0 / -1 unknown) of the validation split, in order."""
    loader = DataLoader(val, batch_size=batch_size, num_workers=num_workers, shuffle=False)
    logits, targets = [], []
    for x, y in progress(loader, len(loader), "calibration: val logits"):
        logits.append(classifier(x.to(classifier.device)).float().cpu())
        targets.append(torch.as_tensor(y).float())
    return torch.cat(logits), torch.cat(targets)


def fit_label_confidence(classifier: Classifier, val: Dataset, **loader: Any) -> Confidence:
    """The temperatures per class on val, the thresholds moved with them (every val image's labels unchanged, or
    an error), and the figures before and after."""
    logits, targets = val_logits(classifier, val, **loader)
    if targets.dim() != 2 or targets.shape[1] != logits.shape[1]:
        raise UserValueError(f"the validation split's labels are {tuple(targets.shape)}, not one 1/0/-1 column per "
                             f"class of this {logits.shape[1]}-class multi-label model: give the config it was "
                             "trained with")
    temperatures = fit_label_temperatures(logits, targets)
    calibration = Calibration(temperatures, score="none", thresholds=moved_thresholds(classifier.thresholds,
                                                                                      temperatures))
    if label_sets(logits, classifier.thresholds) != label_sets(logits, classifier.thresholds, calibration):
        raise UserValueError("the thresholds moved with the temperatures change some val image's labels (a float "
                             "rounding at a cut); the checkpoint is left as it was")
    _, own, takes_shared = temperature_groups(logits.double(), targets.double())
    kept, shared = (~own & ~takes_shared).nonzero().flatten().tolist(), takes_shared.nonzero().flatten().tolist()
    report = {"before": label_figures(logits, targets), "after": label_figures(logits, targets, temperatures),
              "reliability": {"before": pooled_bins(logits, targets),
                              "after": pooled_bins(logits, targets, temperatures)},
              "val_images": len(targets), "kept_at_one": kept, "shared": shared, "labels_unchanged": True}
    return Confidence(calibration, None, report)


def describe_labels(confidence: Confidence, class_names: list[str]) -> list[str]:
    """The lines `vit calibrate` and `vit fit` print for a multi-label checkpoint."""
    c, r = confidence.calibration, confidence.report or {}
    t = c.temperature if isinstance(c.temperature, list) else [c.temperature]
    lines = [f"temperature per class T_c = {min(t):.4f} .. {max(t):.4f} over {len(t)} classes (fit on "
             f"{r.get('val_images', '?')} validation images' BCE)"]
    if r.get("kept_at_one"):
        names = ", ".join(class_names[i] for i in r["kept_at_one"])
        lines.append(f"  T_c = 1 kept for {names}: its val labels are one outcome, or all on the right side of 0 "
                     f"(the BCE has no minimum), or too few wrong to set a T (under {MIN_MISTAKES}, pooled too)")
    if r.get("shared"):
        names = ", ".join(class_names[i] for i in r["shared"])
        lines.append(f"  T = {t[r['shared'][0]]:.4f} for {names}, fit on every class's labels: fewer than "
                     f"{MIN_MISTAKES} wrong val labels each, too few for a T of its own")
    if "before" in r:
        b, a = r["before"], r["after"]
        lines.append(f"  val per-class ECE (mean) {b['ece']:.4f} -> {a['ece']:.4f}, BCE {b['nll']:.4f} -> "
                     f"{a['nll']:.4f}, Brier {b['brier']:.4f} -> {a['brier']:.4f}")
    lines.append("  thresholds moved to sigmoid(logit(t_c) / T_c): every val image's labels unchanged (checked)")
    lines.append(NO_UNKNOWN)
    return lines
