"""Answers that know how sure they are, as they travel with a model: a temperature for the probabilities and an
"unknown" score with its threshold (in the checkpoint, the ONNX export's outputs and metadata, `vit predict`,
`vit serve`). Fitting them is `vit.deploy.calibration`'s; this is what runs at inference. Imports no Lightning.

    probabilities = softmax(logits / T)                        (T: one number, fit on the validation NLL)
    probabilities_c = sigmoid(logit_c / T_c)                   (multi-label: a T per class, fit on its BCE;
                                                                 cut at t'_c = sigmoid(logit(t_c) / T_c))
    score = sum over layers l of (d_l - loc_l) / scale_l        (standardised on val)
    d_l = min over classes c of (z - mu_c)' P_c (z - mu_c)      (z: layer l's features, L2-normalised;
                                                                 mu_c: class means, P_c: class c's precision,
                                                                 or one shared by the classes)
    answer = the unknown label when score > threshold           (threshold: where 95% of val is accepted)
    logits = mean over views v of model(v) when tta = "flip"   (views: the image and its mirror; chosen on val)

The score was chosen by measurement (scripts/experiments/unknown_digits.py, docs/confidence.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SCORE = "mahalanobis_l2_layers"  # Mahalanobis distances on every layer's L2-normalised features, summed
SCORE_PER_CLASS = "mahalanobis_l2_layers_class_covariance"  # the same, each class with its own covariance
DEFAULT_LABEL = "unknown"
CHECKPOINT_KEY = "confidence"  # where a checkpoint holds it
METADATA_KEY = "confidence"  # the ONNX metadata_props key (JSON of `Calibration`)
SCORE_OUTPUT = "unknown_score"  # the ONNX output beside the logits
TTA_CHOICES = ("none", "flip")  # test-time augmentation: the image alone, or also its horizontal mirror


@dataclass
class Calibration:
    """The plain numbers a runner answers with: the temperature, the threshold (None: it cannot reject), the label
    an unknown image gets, how the threshold was chosen (for the record), and the test-time augmentation. A
    multi-label model's: a temperature per class, and the per-class cuts moved onto the calibrated probabilities
    (``thresholds``; `vit.deploy.label_calibration`)."""

    temperature: float | list[float] = 1.0
    threshold: float | None = None
    label: str = DEFAULT_LABEL
    score: str = SCORE
    acceptance: float | None = None
    # the val scores' 101 percentiles, for the record (how the threshold sits among them)
    quantiles: list[float] | None = None
    tta: str = "none"  # "flip" only where it measured better on val (`vit.deploy.calibration.choose_tta`)
    thresholds: list[float] | None = None  # multi-label: the cut per class on sigmoid(logit / T_c)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Calibration:
        keys = ("temperature", "threshold", "label", "score", "acceptance", "quantiles", "tta", "thresholds")
        known = {k: values[k] for k in keys if k in values}
        return cls(**known)


class LayerScore(nn.Module):
    """One layer's squared Mahalanobis distance to the nearest class mean, on L2-normalised features (B, D), under
    one precision shared by the classes (D, D) or one per class (C, D, D). Returns (distance (B,), nearest class
    (B,))."""

    def __init__(self, means: Tensor, precision: Tensor | None = None, *, whiten: Tensor | None = None) -> None:
        super().__init__()
        # P = L L': the distance is |(z - m) L|^2, a sum of squares of differences; expanding it as z'Pz - 2z'Pm +
        # m'Pm instead loses the digits of a small distance between large terms in float32. A half-precision
        # checkpoint stores L, not P: P's entries can pass float16's 65504 where L's (their square roots) do not.
        if whiten is None:
            whiten = torch.linalg.cholesky(precision.double())
        else:
            whiten = whiten.double()
            precision = whiten @ whiten.transpose(-1, -2)
        self.register_buffer("means", means.float())  # (C, D)
        self.register_buffer("precision", precision.float())  # (D, D) or (C, D, D), symmetric positive definite
        self.register_buffer("whiten", whiten.float(), persistent=False)
        # each class's mean in its own whitened coordinates: (C, D)
        whitened = means.double() @ whiten if whiten.dim() == 2 else torch.einsum("cd,cde->ce", means.double(), whiten)
        self.register_buffer("whitened_means", whitened.float(), persistent=False)

    @property
    def per_class(self) -> bool:
        return self.whiten.dim() == 3

    def forward(self, features: Tensor) -> tuple[Tensor, Tensor]:
        z = F.normalize(features.float(), dim=-1)
        if self.per_class:  # subtract, then whiten in each class's coordinates: (B, C, D); the same multiplies
            # as whitening z once per class, and the difference is taken before L magnifies the rounding
            offsets = torch.einsum("bcd,cde->bce", z[:, None, :] - self.means[None], self.whiten)
        else:  # whiten once (B, D), then subtract each whitened mean: C times fewer multiplies
            offsets = (z @ self.whiten)[:, None, :] - self.whitened_means[None]
        return offsets.square().sum(-1).min(dim=-1)  # over (B, C)


class UnknownScore(nn.Module):
    """How far an image is from the training data: each layer's `LayerScore` (every block's mean patch token, then
    the pooled features the head reads), standardised by its mean and standard deviation on val, summed (Lee et
    al. 2018's ensemble of layers). Takes the layers' features [(B, D_l), ...] (or one tensor: the pooled
    features of a one-layer score); returns (score (B,), the nearest class of the last layer (B,))."""

    def __init__(self, layers: list[LayerScore], loc: Tensor | None = None, scale: Tensor | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.register_buffer("loc", torch.zeros(len(layers)) if loc is None else loc.float())
        self.register_buffer("scale", torch.ones(len(layers)) if scale is None else scale.float())

    def distances(self, features: list[Tensor] | Tensor) -> tuple[list[Tensor], Tensor]:
        """Each layer's distance (B,), and the last layer's nearest class."""
        features = [features] if isinstance(features, Tensor) else features
        if len(features) != len(self.layers):
            raise ValueError(f"the unknown score reads {len(self.layers)} layers of features, got {len(features)}")
        found = [layer(f) for layer, f in zip(self.layers, features)]
        return [d for d, _ in found], found[-1][1]

    def forward(self, features: list[Tensor] | Tensor) -> tuple[Tensor, Tensor]:
        distances, nearest = self.distances(features)
        score = sum((d - self.loc[i]) / self.scale[i] for i, d in enumerate(distances))
        return score, nearest

    def state(self, half: bool = False) -> dict[str, Any]:
        """The statistics to store: float32 means and precisions, or (``half``) float16 means and whitening
        factors, half the bytes (`vit.deploy.calibration.in_half` decides where that keeps the answers)."""
        if half:
            layers = [{"means": layer.means.detach().cpu().half(), "whiten": layer.whiten.detach().cpu().half()}
                      for layer in self.layers]
        else:
            layers = [{"means": layer.means.detach().cpu(), "precision": layer.precision.detach().cpu()}
                      for layer in self.layers]
        return {"layers": layers, "loc": self.loc.detach().cpu(), "scale": self.scale.detach().cpu()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> UnknownScore:
        if "means" in state:  # one layer, unstandardised
            return cls([LayerScore(state["means"], state["precision"])])
        layers = [LayerScore(s["means"], s.get("precision"), whiten=s.get("whiten")) for s in state["layers"]]
        return cls(layers, state["loc"], state["scale"])


def pooled_and_logits(model: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """The pooled pre-logits features (B, D) and the logits (B, classes) of one forward pass."""
    if hasattr(model, "tokens"):  # our ViTs: the last block computes only the rows the head reads
        pooled = model.forward_head(model.tokens(x, pooled_only=True), pre_logits=True)
    else:  # a timm network
        pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    return pooled, model.get_classifier()(pooled)


def layer_features(model: nn.Module, x: Tensor) -> tuple[list[Tensor], Tensor]:
    """The features the unknown score reads, from one forward pass: for our ViTs every block's mean patch token
    (B, D) and the pooled features; for a timm network the pooled features alone. And the logits."""
    if not hasattr(model, "tokens"):
        pooled, logits = pooled_and_logits(model, x)
        return [pooled], logits
    blocks: list[Tensor] = []
    prefix = model.num_prefix_tokens
    tokens = model.tokens(x, on_block=lambda i, t: blocks.append(t[:, prefix:].mean(dim=1)))
    pooled = model.forward_head(tokens, pre_logits=True)
    head = model.get_classifier()
    # a distilled ViT's two heads read two tokens, which pre_logits averages: its logits need the head's own path
    logits = head(pooled) if isinstance(head, nn.Module) else model.forward_head(tokens)
    return [*blocks, pooled], logits


class Answering(nn.Module):
    """A network with its unknown score: images -> (logits, score (B,)); what the ONNX export traces."""

    def __init__(self, model: nn.Module, unknown: UnknownScore) -> None:
        super().__init__()
        self.model, self.unknown = model, unknown

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        features, logits = layer_features(self.model, x)
        return logits, self.unknown(features[-len(self.unknown.layers):])[0]


@dataclass
class Confidence:
    """What a checkpoint holds: the `Calibration` numbers and the score's statistics (None when only T was fit)."""

    calibration: Calibration
    unknown: UnknownScore | None = None
    report: dict[str, Any] | None = None  # the figures of the fit (ECE, NLL, Brier before/after, ...)
    half: bool = False  # store the score's statistics in float16 (chosen where it keeps every val answer)

    def to_checkpoint(self) -> dict[str, Any]:
        stats = self.unknown.state(self.half) if self.unknown is not None else None
        return {**self.calibration.to_dict(), "stats": stats, "report": self.report}

    @classmethod
    def from_checkpoint(cls, values: dict[str, Any]) -> Confidence:
        stats = values.get("stats")
        unknown = UnknownScore.from_state(stats) if stats else None
        half = bool(stats) and "whiten" in (stats.get("layers") or [{}])[0]
        return cls(Calibration.from_dict(values), unknown, values.get("report"), half)


def calibrated_probabilities(logits: Tensor, calibration: Calibration | None) -> Tensor:
    """softmax(logits / T) (T = 1 without a calibration), in float32."""
    temperature = calibration.temperature if calibration is not None else 1.0
    return (logits.float() / temperature).softmax(dim=-1)


def tta_views(images: Tensor, tta: str) -> list[Tensor]:
    """The views whose logits are averaged: the images (B, C, H, W), and with "flip" their mirrors too."""
    if tta not in TTA_CHOICES:
        raise ValueError(f"tta must be one of {', '.join(TTA_CHOICES)}, got {tta!r}")
    return [images, images.flip(-1)] if tta == "flip" else [images]


def tta_logits(forward: Any, images: Tensor, tta: str, logits: Tensor | None = None) -> Tensor:
    """The mean of ``forward``'s logits over the `tta_views` of ``images`` (``logits``: the first view's, already
    computed). The unknown score stays the plain image's: its threshold was set on plain images."""
    views = tta_views(images, tta)
    first = forward(views[0]) if logits is None else logits
    if len(views) == 1:
        return first
    return (first.float() + sum(forward(v).float() for v in views[1:])) / len(views)


def decisions(scores: Tensor | None, calibration: Calibration | None, accept_all: bool = False) -> list[bool]:
    """Whether each image is unknown: its score above the threshold (never with ``accept_all``, no score, or no
    threshold)."""
    if scores is None or calibration is None or calibration.threshold is None or accept_all:
        return [False] * (len(scores) if scores is not None else 0)
    return (scores.float() > calibration.threshold).tolist()
