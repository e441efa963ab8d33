"""Fitting what `vit.deploy.confidence` answers with, on a classifier's own training and validation splits:
`vit calibrate` and the end of `vit fit` call `calibrate_checkpoint`.

- the temperature: one T by LBFGS on the validation NLL (Guo et al. 2017); top-1 never changes (T > 0);
- ECE (15 bins, torchmetrics' MulticlassCalibrationError), NLL and Brier score on val, before and after;
- test-time augmentation: the val top-1 and NLL (after T) of the logits with and without the mirror averaged in,
  and their time per image; "flip" is stored only where it measured better (it can turn right answers wrong);
- the unknown score's class means and shared precision on the training split's features (evaluation transform),
  and the threshold that accepts ``acceptance`` of the validation images (default 95%).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from vit.checkpoints.io import read_checkpoint, save_checkpoint
from vit.data.protocol import ImageSplits
from vit.deploy.classifier import Classifier
from vit.deploy.confidence import (
    CHECKPOINT_KEY,
    DEFAULT_LABEL,
    SCORE,
    SCORE_PER_CLASS,
    Calibration,
    Confidence,
    LayerScore,
    UnknownScore,
    layer_features,
    tta_logits,
)
from vit.errors import UserValueError
from vit.progress import progress

ACCEPTANCE = 0.95
ECE_BINS = 15
SHRINKAGE = 0.001  # of the covariance towards the identity (see fit_layer; 1% cost 0.004 AUROC)
COVARIANCES = ("auto", "class", "shared")
CLASS_SHRINKAGE = 0.1  # of each class's covariance towards the shared one (3%-30% measured alike)
# the most float16 bytes a covariance per class may add to a checkpoint: ViT-S/16's 13 layers with 3 classes would
# add 11.5 MB to a 1.9 MB LoRA checkpoint (its bar is 8 MB); one shared covariance there adds 3.8 MB
CLASS_COVARIANCE_BYTES = 4 * 2**20
HALF_TOLERANCE = 0.01  # float16 statistics where no val score moves more than this share of their spread
# The most images of a split calibration reads (a seeded sample past it): means, covariances, T and a 95% quantile
# settle long before, and every layer's features of ImageNet's 1.28M images (51 GB) would not fit in memory.
MAX_SPLIT_IMAGES = 20_000


def fit_temperature(logits: Tensor, labels: Tensor) -> float:
    """The T > 0 that minimises the NLL of softmax(logits / T) (LBFGS on log T, from T = 1). When every image is
    classified right the NLL has no minimum (it falls as T -> 0, which wrecks the probabilities of the next
    mistake): T stays 1."""
    logits, labels = logits.double(), labels.long()
    if bool((logits.argmax(-1) == labels).all()):
        return 1.0
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.1, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(logits / log_t.exp(), labels)
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(log_t.detach().exp())


def calibration_figures(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> dict[str, float]:
    """ECE (15 bins, L1), NLL, Brier score (sum over classes, mean over images) and top-1 of softmax(logits / T)."""
    from torchmetrics.classification import MulticlassCalibrationError

    scaled = logits.double() / temperature
    probs = scaled.softmax(-1)
    ece = MulticlassCalibrationError(num_classes=logits.shape[1], n_bins=ECE_BINS, norm="l1")
    onehot = F.one_hot(labels.long(), logits.shape[1]).double()
    return {"ece": float(ece(probs.float(), labels.long())), "nll": float(F.cross_entropy(scaled, labels.long())),
            "brier": float(((probs - onehot) ** 2).sum(-1).mean()),
            "top1": float((logits.argmax(-1) == labels).double().mean())}


def reliability_bins(logits: Tensor, labels: Tensor, temperature: float = 1.0,
                     bins: int = ECE_BINS) -> dict[str, list[float]]:
    """The reliability diagram's numbers for softmax(logits / T): per confidence bin (``bins`` equal widths, as the
    ECE's), the mean top probability, the accuracy and the image count; empty bins left out."""
    probs = (logits.double() / temperature).softmax(-1)
    confidence, predicted = probs.max(-1)
    right = (predicted == labels.long()).double()
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64)
    which = (torch.bucketize(confidence, edges, right=True) - 1).clamp(0, bins - 1)  # as torchmetrics bins them
    count = torch.bincount(which, minlength=bins)
    used = count > 0

    def mean(values: Tensor) -> list[float]:
        return (torch.zeros(bins, dtype=torch.float64).index_add_(0, which, values)[used] / count[used]).tolist()

    return {"confidence": mean(confidence), "accuracy": mean(right), "count": count[used].tolist()}


def fit_layer(features: Tensor, labels: Tensor, num_classes: int, shrinkage: float = SHRINKAGE,
              per_class: bool = False) -> LayerScore:
    """Class means and the precision of one layer's L2-normalised features. Shared: the inverse of the within-class
    covariance S shrunk towards a multiple of the identity, (1 - s) S + s tr(S)/D I, which keeps it invertible
    with fewer images than features (a barely trained network's features span few directions). ``per_class``:
    each class's own covariance shrunk by `CLASS_SHRINKAGE` towards that shared one (regularised discriminant
    analysis, Friedman 1989), invertible even for a class of one image. A class without images is an error."""
    z = F.normalize(features.double(), dim=-1)
    counts = torch.bincount(labels.long(), minlength=num_classes)
    if (counts == 0).any():
        missing = counts.eq(0).nonzero().flatten().tolist()
        raise UserValueError(f"the training split has no images of class(es) {missing}: the unknown score needs "
                             "every class's mean")
    means = torch.zeros(num_classes, z.shape[1], dtype=torch.float64).index_add_(0, labels.long(), z)
    means /= counts[:, None]
    centred = z - means[labels.long()]
    covariance = centred.T @ centred / len(z)
    identity = torch.eye(z.shape[1], dtype=torch.float64)
    # the identity's scale: the covariance's mean variance, or 1 where there is none (one image a class: S = 0)
    scale = covariance.trace() / z.shape[1] if covariance.trace() > 0 else 1.0
    covariance = (1 - shrinkage) * covariance + shrinkage * scale * identity
    if per_class:
        own = torch.stack([c.T @ c / len(c) for c in (centred[labels.long() == k] for k in range(num_classes))])
        covariance = (1 - CLASS_SHRINKAGE) * own + CLASS_SHRINKAGE * covariance  # (C, D, D)
    # Cholesky, not torch.linalg.inv: torch 2.14.1's batched LU (MKL getrf) hangs at 2+ threads (after "DLASWP"
    # errors) on a covariance per class; the covariance is symmetric positive definite (shrunk), so this is exact
    precision = torch.cholesky_inverse(torch.linalg.cholesky(covariance))
    return LayerScore(means.float(), ((precision + precision.transpose(-1, -2)) / 2).float())


def sample(dataset: Dataset, limit: int | None = None, seed: int = 0) -> Dataset:
    """``dataset`` itself up to ``limit`` images (default `MAX_SPLIT_IMAGES`); past it a seeded random ``limit``
    of them, in order."""
    limit = MAX_SPLIT_IMAGES if limit is None else limit
    if len(dataset) <= limit:
        return dataset
    keep = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:limit]
    return Subset(dataset, keep.sort().values.tolist())


def per_class_fits(num_classes: int, widths: list[int], budget: int = CLASS_COVARIANCE_BYTES) -> bool:
    """Whether a covariance per class keeps the statistics within ``budget`` bytes (float16, every layer): a few
    classes on a small ViT, where it measured best; one shared covariance otherwise (C times fewer bytes)."""
    return 2 * num_classes * sum(d * d for d in widths) <= budget


def fit_unknown(train: Tensor | list[Tensor], labels: Tensor, num_classes: int, val: list[Tensor] | None = None,
                shrinkage: float = SHRINKAGE, per_class: bool = False) -> UnknownScore:
    """The unknown score of the layers' training features (one tensor: one layer), each layer's distance
    standardised by its mean and standard deviation over the ``val`` features (none for one layer)."""
    train = [train] if isinstance(train, Tensor) else train
    score = UnknownScore([fit_layer(f, labels, num_classes, shrinkage, per_class) for f in train])
    if val is None or len(train) == 1:
        return score
    distances = torch.stack(score.distances(val)[0])  # (layers, N)
    return UnknownScore(list(score.layers), distances.mean(1), distances.std(1, correction=0))


def in_half(unknown: UnknownScore, val: list[Tensor]) -> tuple[UnknownScore, bool]:
    """The score with float16 statistics (half the checkpoint bytes) where that keeps the answers on val: the same
    images accepted at the default acceptance (each score's own threshold), and no score moved by more than
    `HALF_TOLERANCE` of the val scores' standard deviation. Else the float32 score. Returns (score, whether half)."""
    rounded = UnknownScore.from_state(unknown.state(half=True))
    full, half = unknown(val)[0].double(), rounded(val)[0].double()
    same = torch.equal(full > threshold_at(full, ACCEPTANCE), half > threshold_at(half, ACCEPTANCE))
    keeps = same and float((full - half).abs().max()) <= HALF_TOLERANCE * float(full.std())
    return (rounded, True) if keeps else (unknown, False)


def threshold_at(scores: Tensor, acceptance: float) -> float:
    """The smallest of ``scores`` at or below which at least ``acceptance`` of them fall (no interpolation, so the
    share accepted is never under the target)."""
    if not 0 < acceptance <= 1:
        raise UserValueError(f"the acceptance must be in (0, 1], got {acceptance}")
    return float(torch.quantile(scores.double(), acceptance, interpolation="higher"))


def threshold_between(inside: Tensor, outside: Tensor) -> float:
    """The threshold that best tells ``inside`` (val, to accept) from ``outside`` (known outliers, to reject): the
    candidate score with the highest mean of the share accepted and the share rejected (balanced accuracy)."""
    candidates = torch.cat([inside, outside]).double().unique()
    accepted = (inside.double()[None] <= candidates[:, None]).double().mean(1)
    rejected = (outside.double()[None] > candidates[:, None]).double().mean(1)
    return float(candidates[(accepted + rejected).argmax()])


@torch.no_grad()
def folder_scores(classifier: Classifier, unknown: UnknownScore, folder: str | os.PathLike) -> Tensor:
    """The unknown score of every readable image under ``folder`` (as `vit predict` reads them)."""
    from vit.data.io import find_images
    from vit.deploy.image_files import ImagePaths, collate_readable

    try:
        files = find_images([folder]).files
    except UserValueError:
        raise UserValueError(f"the threshold folder {folder} holds no image files: give it images of none of the "
                             "model's classes (backgrounds, other objects), or leave --outliers out to set the "
                             "threshold by --acceptance") from None
    dataset = ImagePaths(files, classifier.eval_transform(), classifier.image_mode, classifier.eval_short_side())
    scores = []
    for batch in DataLoader(dataset, batch_size=256, collate_fn=collate_readable):
        if batch.images is not None:
            scores.append(unknown(layer_features(classifier.model, batch.images.to(classifier.device))[0])[0])
    if not scores:
        raise UserValueError(f"none of the {len(files)} files in the threshold folder {folder} could be read")
    return torch.cat(scores).cpu()


@torch.no_grad()
def split_outputs(classifier: Classifier, dataset: Dataset, name: str, batch_size: int = 256,
                  num_workers: int = 0) -> tuple[list[Tensor], Tensor, Tensor]:
    """The layers' features [(N, D), ...] (`layer_features`), logits (N, C) and labels (N,) of a split, in order."""
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, shuffle=False)
    features, logits, labels = [], [], []
    for x, y in progress(loader, len(loader), f"calibration: {name} features"):
        layers, out = layer_features(classifier.model, x.to(classifier.device))
        features.append([f.float().cpu() for f in layers])
        logits.append(out.float().cpu())
        labels.append(torch.as_tensor(y))
    return [torch.cat(layer) for layer in zip(*features)], torch.cat(logits), torch.cat(labels)


@torch.no_grad()
def timed_logits(classifier: Classifier, dataset: Dataset, tta: str, batch_size: int = 256,
                 num_workers: int = 0) -> tuple[Tensor, float]:
    """The logits (N, C) of a split averaged over the ``tta`` views, and the seconds the model took on them."""
    out, seconds = [], 0.0
    for x, _ in DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, shuffle=False):
        x = x.to(classifier.device)
        start = time.perf_counter()
        out.append(tta_logits(classifier, x, tta).float().cpu())
        seconds += time.perf_counter() - start
    return torch.cat(out), seconds


def choose_tta(plain: Tensor, flipped: Tensor, labels: Tensor) -> tuple[str, dict[str, dict[str, float]]]:
    """"flip" when averaging in the mirror answers more val images right; else "none". And both's figures (each
    after its own T). A lower NLL at the same top-1 is not enough: the mirror costs a second forward pass, and
    exports that cannot average it in (timm, transformers) would then name another class_1 on near ties (the
    tie-break chose flip on a LoRA fit at chance, NLL 1.0986 -> 1.0956 on 30 images; 1 of 31 test labels moved)."""
    figures = {}
    for name, logits in (("none", plain), ("flip", flipped)):
        figures[name] = calibration_figures(logits, labels, fit_temperature(logits, labels))
    return ("flip" if figures["flip"]["top1"] > figures["none"]["top1"] else "none"), figures


def measure_tta(classifier: Classifier, val: Dataset, labels: Tensor,
                **loader: Any) -> tuple[str, dict[str, Any], Tensor]:
    """`choose_tta` on val, with the time per image of "flip" over that of "none" (its cost); the chosen logits."""
    plain, plain_s = timed_logits(classifier, val, "none", **loader)
    flipped, flip_s = timed_logits(classifier, val, "flip", **loader)
    tta, figures = choose_tta(plain, flipped, labels)
    report = {**figures, "chosen": tta, "time_ratio": flip_s / max(plain_s, 1e-9)}
    return tta, report, flipped if tta == "flip" else plain


def fit_confidence(classifier: Classifier, train: Dataset, val: Dataset, *, acceptance: float = ACCEPTANCE,
                   label: str = DEFAULT_LABEL, outliers: str | os.PathLike | None = None,
                   layers: str = "all", covariance: str = "auto", **loader: Any) -> Confidence:
    """T on val, the unknown score on train, its threshold on val (``acceptance`` of it accepted; with a folder of
    ``outliers``, the threshold that best tells val from them), with the figures before and after T. ``layers``:
    "all" (every block and the pooled features: measured best, docs/confidence.md) or "pooled" (the head's input
    alone: one layer's statistics, for a checkpoint that must stay small). ``covariance``: "class" (one per class:
    measured best), "shared", or "auto" (per class where it fits `CLASS_COVARIANCE_BYTES`)."""
    if layers not in ("all", "pooled"):
        raise UserValueError(f"layers must be 'all' or 'pooled', got {layers!r}")
    if covariance not in COVARIANCES:
        raise UserValueError(f"covariance must be one of {', '.join(COVARIANCES)}, got {covariance!r}")
    if val is None or len(val) == 0:
        raise UserValueError("calibration needs a validation split, and this data has none: give the datamodule "
                             "one (e.g. --data.init_args.val_fraction 0.1, or a val/ folder)")
    train_features, _, train_labels = split_outputs(classifier, train, "train", **loader)
    val_features, val_logits, val_labels = split_outputs(classifier, val, "val", **loader)
    if layers == "pooled":
        train_features, val_features = train_features[-1:], val_features[-1:]
    # T is fit on the logits the runners will divide by it: the mirror averaged in when TTA is chosen
    tta, tta_report, val_logits = measure_tta(classifier, val, val_labels, **loader)
    temperature = fit_temperature(val_logits, val_labels)
    classes = len(classifier.class_names)
    per_class = covariance == "class" or (covariance == "auto" and
                                          per_class_fits(classes, [f.shape[1] for f in train_features]))
    unknown = fit_unknown(train_features, train_labels, classes, val=val_features, per_class=per_class)
    unknown, half = in_half(unknown, val_features)
    val_scores = unknown(val_features)[0]
    if outliers is None:
        threshold = threshold_at(val_scores, acceptance)
    else:
        threshold = threshold_between(val_scores, folder_scores(classifier, unknown, outliers))
        acceptance = float((val_scores <= threshold).double().mean())
    report = {"before": calibration_figures(val_logits, val_labels),
              "after": calibration_figures(val_logits, val_labels, temperature),
              "reliability": {"before": reliability_bins(val_logits, val_labels),
                              "after": reliability_bins(val_logits, val_labels, temperature)},
              "val_images": len(val_labels), "train_images": len(train_labels), "tta": tta_report}
    quantiles = torch.quantile(val_scores.double(), torch.linspace(0, 1, 101, dtype=torch.float64)).tolist()
    calibration = Calibration(temperature, threshold, label, SCORE_PER_CLASS if per_class else SCORE,
                              acceptance=acceptance, quantiles=quantiles, tta=tta)
    return Confidence(calibration, unknown, report, half)


@torch.no_grad()
def split_logits(classifier: Classifier, dataset: Dataset, name: str, batch_size: int = 256,
                 num_workers: int = 0) -> tuple[Tensor, Tensor]:
    """The logits (N, C) and labels (N,) of a split, in order: all a temperature needs."""
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, shuffle=False)
    logits, labels = [], []
    for x, y in progress(loader, len(loader), f"calibration: {name} logits"):
        logits.append(classifier(x.to(classifier.device)).float().cpu())
        labels.append(torch.as_tensor(y))
    return torch.cat(logits), torch.cat(labels)


def fit_temperature_only(classifier: Classifier, val: Dataset, **loader: Any) -> Confidence:
    """T on val and its figures before and after, nothing else: what `vit fit` stores by default. No unknown score
    and no TTA (each can change an answer; T cannot), so the checkpoint grows by a few numbers and its top-1 stays
    the exports' (timm, transformers, ONNX)."""
    if val is None or len(val) == 0:
        raise UserValueError("calibration needs a validation split, and this data has none: give the datamodule "
                             "one (e.g. --data.init_args.val_fraction 0.1, or a val/ folder)")
    logits, labels = split_logits(classifier, val, "val", **loader)
    temperature = fit_temperature(logits, labels)
    report = {"before": calibration_figures(logits, labels), "after": calibration_figures(logits, labels, temperature),
              "reliability": {"before": reliability_bins(logits, labels),
                              "after": reliability_bins(logits, labels, temperature)},
              "val_images": len(labels)}
    return Confidence(Calibration(temperature), None, report)


def describe(confidence: Confidence) -> list[str]:
    """The lines `vit calibrate` and `vit fit` print."""
    c, r = confidence.calibration, confidence.report or {}
    lines = [f"temperature T = {c.temperature:.4f} (fit on {r.get('val_images', '?')} validation images)"]
    if "before" in r:
        b, a = r["before"], r["after"]
        lines.append(f"  val ECE {b['ece']:.4f} -> {a['ece']:.4f}, NLL {b['nll']:.4f} -> {a['nll']:.4f}, "
                     f"Brier {b['brier']:.4f} -> {a['brier']:.4f} (top-1 {a['top1']:.4f}, unchanged)")
    if c.threshold is not None:
        layers = len(confidence.unknown.layers) if confidence.unknown is not None else 0
        stats = confidence.unknown.state(confidence.half) if confidence.unknown is not None else {"layers": []}
        kib = sum(t.numel() * t.element_size() for layer in stats["layers"] for t in layer.values()) / 1024
        lines.append(f"unknown: {c.score} score ({layers} layer(s)) above {c.threshold:.4g} answers {c.label!r} "
                     f"({100 * c.acceptance:.0f}% of val accepted; {'float16' if confidence.half else 'float32'} "
                     f"statistics, {kib:.0f} KiB in the checkpoint)")
    if "tta" in r:
        a, b = r["tta"]["none"], r["tta"]["flip"]
        lines.append(f"TTA flip (mirror averaged in): val top-1 {a['top1']:.4f} -> {b['top1']:.4f}, NLL "
                     f"{a['nll']:.4f} -> {b['nll']:.4f}, {r['tta']['time_ratio']:.2f}x the time per image: "
                     + ("on (predict and serve use it; --tta none turns it off)" if c.tta == "flip" else
                        "off (not better on val; --tta flip forces it)"))
    return lines


def save_confidence(path: str | os.PathLike, confidence: Confidence, out: str | os.PathLike | None = None,
                    checkpoint: dict[str, Any] | None = None) -> Path:
    """Write ``confidence`` into the checkpoint at ``path`` (or a copy at ``out``), atomically; ``checkpoint``: the
    file's contents when the caller read them already."""
    checkpoint = read_checkpoint(path) if checkpoint is None else checkpoint
    checkpoint[CHECKPOINT_KEY] = confidence.to_checkpoint()
    return save_checkpoint(checkpoint, out or path)


def calibrate_checkpoint(path: str | os.PathLike, data: Any, *, acceptance: float = ACCEPTANCE,
                         label: str = DEFAULT_LABEL, out: str | os.PathLike | None = None,
                         device: str = "cpu", outliers: str | os.PathLike | None = None, layers: str = "all",
                         covariance: str = "auto", figure_dir: str | os.PathLike | None = None,
                         say: Any = print, unknown: bool = True, draw: bool = True) -> Confidence:
    """Fit T and the unknown score of the checkpoint at ``path`` on ``data``'s train and val splits (a set-up
    `vit.data` datamodule) and store them in it (or in a copy at ``out``); prints what it found, and draws the
    reliability diagram before and after T as reliability.png in ``figure_dir`` (default: beside the checkpoint).
    ``unknown=False``: T alone (`fit_temperature_only`); ``draw=False``: no diagram. A multi-label checkpoint gets
    a temperature per class alone (`vit.deploy.label_calibration`)."""
    from vit.deploy.classifier import checkpoint_classifier, is_multi_label

    checkpoint = read_checkpoint(path)  # read once: the classifier is built from it, and it is written back
    classifier = checkpoint_classifier(checkpoint, path, device)
    if not isinstance(data, ImageSplits):
        raise UserValueError(f"cannot calibrate {path}: the data ({type(data).__name__}) is not an image DataModule "
                             "(`vit.data.protocol.ImageSplits`: class_names, train_set, val_set, num_workers, "
                             "eval_split): use one of vit.data's, or give yours those")
    if data.val_set is None or len(data.val_set) == 0:
        raise UserValueError(f"cannot calibrate {path}: the data ({type(data).__name__}) has no validation split, "
                             "and T and the threshold are fit on it. Give it one (e.g. --data.init_args.val_fraction "
                             "0.1, or a val/ folder beside train/)")
    workers = {"num_workers": data.num_workers}
    train, val = (data.eval_split(split) for split in ("train", "val"))
    for name, split in (("training", train), ("validation", val)):
        if len(split) > MAX_SPLIT_IMAGES and (name == "validation" or (unknown and not is_multi_label(classifier))):
            say(f"calibration reads a seeded {MAX_SPLIT_IMAGES:,} of the {len(split):,} {name} images")
    if is_multi_label(classifier):  # a sigmoid per class, cut at per-class thresholds
        from vit.deploy.label_calibration import NO_UNKNOWN, describe_labels, fit_label_confidence

        if outliers is not None:
            raise UserValueError(f"--outliers {outliers}: {path} is multi-label, and {NO_UNKNOWN}; leave it out")
        confidence = fit_label_confidence(classifier, sample(val), **workers)
        lines, answers = describe_labels(confidence, classifier.class_names), "a temperature per class"
    elif not unknown:
        confidence = fit_temperature_only(classifier, sample(val), **workers)
        lines, answers = describe(confidence), "T (calibrated probabilities; no 'unknown' answer)"
    else:
        confidence = fit_confidence(classifier, sample(train), sample(val), acceptance=acceptance, label=label,
                                    outliers=outliers, layers=layers, covariance=covariance, **workers)
        lines, answers = describe(confidence), f"T and {label!r}"
    saved = save_confidence(path, confidence, out, checkpoint)
    for line in lines:
        say(line)
    if draw:
        drawn = draw_reliability(confidence, saved, figure_dir)
        say(f"reliability diagram (val, before and after T, images per bin beneath): {drawn}")
    say(f"calibrated {saved}: vit predict and vit serve answer with {answers}; vit export carries them")
    return confidence


def draw_reliability(confidence: Confidence, saved: Path, figure_dir: str | os.PathLike | None) -> Path:
    """reliability.png in ``figure_dir`` (default: beside the checkpoint): the val bins before and after T; a
    multi-label model's over every known (image, class) pair, pooled."""
    from vit.reports import reliability_figure, save_figure

    bins, t = confidence.report["reliability"], confidence.calibration.temperature
    title = f"{Path(saved).name}: validation split"
    if isinstance(t, list):
        figure = reliability_figure(bins["before"], bins["after"], "a T per class", f"{Path(saved).name}: val",
                                    xlabel="predicted probability (every class, pooled)", ylabel="share positive",
                                    counted="image-class pairs")
    else:
        figure = reliability_figure(bins["before"], bins["after"], t, title)
    return save_figure(figure, Path(figure_dir or Path(saved).parent) / "reliability.png")
