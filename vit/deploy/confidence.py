"""Answers that know how sure they are, as they travel with a model: a temperature for the probabilities and an
"unknown" score with its threshold (in the checkpoint, the ONNX export's outputs and metadata, `vit predict`,
`vit serve`). Fitting them is `vit.tasks.calibrate`'s; this is what runs at inference. Imports no Lightning.

    probabilities = softmax(logits / T)                        (T: one number, fit on the validation NLL)
    score = min over classes c of (z - mu_c)' P (z - mu_c)      (z: the pooled features, L2-normalised;
                                                                 mu_c: class means, P: the shared precision)
    answer = the unknown label when score > threshold           (threshold: where 95% of val is accepted)

The score was chosen by measurement (scripts/experiments/unknown_digits.py, docs/confidence.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SCORE = "mahalanobis_l2"  # the class-conditional Mahalanobis distance on L2-normalised pooled features
DEFAULT_LABEL = "unknown"
CHECKPOINT_KEY = "confidence"  # where a checkpoint holds it
METADATA_KEY = "confidence"  # the ONNX metadata_props key (JSON of `Calibration`)
SCORE_OUTPUT = "unknown_score"  # the ONNX output beside the logits


@dataclass
class Calibration:
    """The plain numbers a runner answers with: the temperature, the threshold (None: it cannot reject), the label
    an unknown image gets, and how the threshold was chosen (for the record)."""

    temperature: float = 1.0
    threshold: float | None = None
    label: str = DEFAULT_LABEL
    score: str = SCORE
    acceptance: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Calibration:
        known = {k: values[k] for k in ("temperature", "threshold", "label", "score", "acceptance") if k in values}
        return cls(**known)


class UnknownScore(nn.Module):
    """The distance of pooled features (B, D) from the training data: the squared Mahalanobis distance to the
    nearest class mean under one shared covariance, on L2-normalised features. Returns (score (B,), nearest (B,))."""

    def __init__(self, means: Tensor, precision: Tensor) -> None:
        super().__init__()
        self.register_buffer("means", means.float())  # (C, D)
        self.register_buffer("precision", precision.float())  # (D, D), symmetric positive definite
        # P = L L': the distance is |(z - m) L|^2, a sum of squares of differences; expanding it as z'Pz - 2z'Pm +
        # m'Pm instead loses the digits of a small distance between large terms in float32
        whiten = torch.linalg.cholesky(precision.double())
        self.register_buffer("whiten", whiten.float(), persistent=False)
        self.register_buffer("whitened_means", (means.double() @ whiten).float(), persistent=False)

    def forward(self, pooled: Tensor) -> tuple[Tensor, Tensor]:
        z = F.normalize(pooled.float(), dim=-1) @ self.whiten  # (B, D)
        dist = (z[:, None, :] - self.whitened_means[None]).square().sum(-1)  # (B, C)
        score, nearest = dist.min(dim=-1)
        return score, nearest

    def state(self) -> dict[str, Tensor]:
        return {"means": self.means.detach().cpu(), "precision": self.precision.detach().cpu()}


def pooled_and_logits(model: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """The pooled pre-logits features (B, D) and the logits (B, classes) of one forward pass."""
    if hasattr(model, "tokens"):  # our ViTs: the last block computes only the rows the head reads
        pooled = model.forward_head(model.tokens(x, pooled_only=True), pre_logits=True)
    else:  # a timm network
        pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    return pooled, model.get_classifier()(pooled)


class Answering(nn.Module):
    """A network with its unknown score: images -> (logits, score (B,)); what the ONNX export traces."""

    def __init__(self, model: nn.Module, unknown: UnknownScore) -> None:
        super().__init__()
        self.model, self.unknown = model, unknown

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        pooled, logits = pooled_and_logits(self.model, x)
        return logits, self.unknown(pooled)[0]


@dataclass
class Confidence:
    """What a checkpoint holds: the `Calibration` numbers and the score's statistics (None when only T was fit)."""

    calibration: Calibration
    unknown: UnknownScore | None = None
    report: dict[str, Any] | None = None  # the figures of the fit (ECE, NLL, Brier before/after, ...)

    def to_checkpoint(self) -> dict[str, Any]:
        return {**self.calibration.to_dict(), "stats": self.unknown.state() if self.unknown is not None else None,
                "report": self.report}

    @classmethod
    def from_checkpoint(cls, values: dict[str, Any]) -> Confidence:
        stats = values.get("stats")
        unknown = UnknownScore(stats["means"], stats["precision"]) if stats else None
        return cls(Calibration.from_dict(values), unknown, values.get("report"))


def calibrated_probabilities(logits: Tensor, calibration: Calibration | None) -> Tensor:
    """softmax(logits / T) (T = 1 without a calibration), in float32."""
    temperature = calibration.temperature if calibration is not None else 1.0
    return (logits.float() / temperature).softmax(dim=-1)


def decisions(scores: Tensor | None, calibration: Calibration | None, accept_all: bool = False) -> list[bool]:
    """Whether each image is unknown: its score above the threshold (never with ``accept_all``, no score, or no
    threshold)."""
    if scores is None or calibration is None or calibration.threshold is None or accept_all:
        return [False] * (len(scores) if scores is not None else 0)
    return (scores.float() > calibration.threshold).tolist()
