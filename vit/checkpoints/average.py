"""Averages of classifier checkpoints in weight space: WiSE-FT between two (Wortsman et al. 2022), a uniform
soup of several (Wortsman et al. 2022, "model soups").

    A, B, alpha          ─► (1 - alpha) * A + alpha * B     (alpha 0: A; alpha 1: B)
    A, B, C, ...         ─► (A + B + C + ...) / n

Only checkpoints of one architecture and one class list average into something meaningful: the same parameter
names and shapes, the same model config (dropout rates aside, which change no weight), the same class names in the
same order and the same input normalisation. Anything else is refused in one line that names both files. Each
checkpoint gives the weights it is evaluated with (its EMA copy when it has one); the result is a plain
classifier checkpoint (`classifier_checkpoint`) that every command reads. A calibration (``vit calibrate``) is
not carried over: it belongs to one model, and the average is another.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from vit.checkpoints.io import read_checkpoint
from vit.checkpoints.meta import classifier_checkpoint, evaluated_weights, expect_task
from vit.errors import UserValueError

# model_config entries that change how a model trains, not which weights it has
TRAINING_ONLY = ("drop_rate", "pos_drop_rate", "attn_drop_rate", "drop_path_rate")


class MismatchedCheckpointsError(UserValueError):
    """Two checkpoints whose weights cannot be averaged: other architectures or other classes."""


def mixing_weights(count: int, alpha: float | None) -> list[float]:
    """The weight of each of ``count`` checkpoints: ``1 - alpha, alpha`` for two with an ``alpha``, else uniform."""
    if count < 2:
        raise UserValueError(f"averaging needs at least two checkpoints, got {count}: pass --ckpt A --ckpt B")
    if alpha is None:
        return [1.0 / count] * count
    if count != 2:
        raise UserValueError(f"--alpha mixes two checkpoints (WiSE-FT), got {count}: leave --alpha out for a "
                             "uniform soup of all of them")
    if not 0.0 <= alpha <= 1.0:
        raise UserValueError(f"--alpha must lie in [0, 1] (0 gives the first checkpoint, 1 the second), got {alpha}")
    return [1.0 - alpha, alpha]


def architecture(meta: dict[str, Any]) -> dict[str, Any]:
    """What must agree between checkpoints for their weights to average: model, its config, the inputs' layout."""
    config = {k: v for k, v in (meta.get("model_config") or {}).items() if k not in TRAINING_ONLY}
    keep = ("model_name", "model_source", "img_size")
    return {"config": config, **{k: meta.get(k) for k in keep}}


def mismatch(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """How checkpoint b's meta and evaluated weights differ from a's, in a few words; None when they agree.
    ``a`` and ``b`` are ``{"meta": ..., "weights": ...}``."""
    meta_a, meta_b = a["meta"], b["meta"]
    arch_a, arch_b = architecture(meta_a), architecture(meta_b)
    if arch_a["model_name"] != arch_b["model_name"]:
        return f"different models ({arch_a['model_name']} and {arch_b['model_name']})"
    names_a, names_b = list(meta_a.get("class_names") or []), list(meta_b.get("class_names") or [])
    if names_a != names_b:
        if sorted(names_a) == sorted(names_b):
            return "the same classes in another order (head rows would mix different classes)"
        only_a, only_b = sorted(set(names_a) - set(names_b)), sorted(set(names_b) - set(names_a))
        return (f"different class lists ({len(names_a)} and {len(names_b)} classes; only in the first: "
                f"{', '.join(only_a[:3]) or '-'}; only in the second: {', '.join(only_b[:3]) or '-'})")
    if arch_a != arch_b:
        config_a, config_b = arch_a["config"], arch_b["config"]
        keys = sorted(k for k in set(config_a) | set(config_b) if config_a.get(k) != config_b.get(k))
        shown = ", ".join(f"{k} {config_a.get(k)} and {config_b.get(k)}" for k in keys[:3]) or "model source or size"
        return f"different architectures ({shown})"
    if (meta_a.get("mean"), meta_a.get("std")) != (meta_b.get("mean"), meta_b.get("std")):
        return (f"different input normalisation (mean/std {meta_a.get('mean')}/{meta_a.get('std')} and "
                f"{meta_b.get('mean')}/{meta_b.get('std')})")
    wa, wb = a["weights"], b["weights"]
    if set(wa) != set(wb):
        odd = sorted(set(wa) ^ set(wb))
        return f"different parameters ({len(odd)} names in one only, e.g. {odd[0]})"
    shapes = [k for k in wa if wa[k].shape != wb[k].shape]
    if shapes:
        k = shapes[0]
        return f"different shapes ({k}: {tuple(wa[k].shape)} and {tuple(wb[k].shape)})"
    return None


def read_for_average(path: str | os.PathLike) -> dict[str, Any]:
    """A classifier checkpoint's meta and evaluated weights (its EMA copy when trained with one)."""
    checkpoint = read_checkpoint(path)
    meta = expect_task(checkpoint, "classify", path)
    return {"meta": meta, "weights": evaluated_weights(checkpoint["state_dict"], bool(meta.get("ema")))}


def average_weights(weights: Sequence[dict[str, Tensor]], mix: Sequence[float]) -> dict[str, Tensor]:
    """``sum_i mix[i] * weights[i]`` for every floating-point tensor, in float64 and back to its dtype; integer
    tensors (counters, index buffers) are the first's."""
    out = {}
    for key, first in weights[0].items():
        if not torch.is_floating_point(first):
            out[key] = first.clone()
            continue
        total = sum(m * w[key].to(torch.float64) for m, w in zip(mix, weights))
        out[key] = total.to(first.dtype)
    return out


def average_checkpoints(paths: Sequence[str | os.PathLike], alpha: float | None = None) -> dict[str, Any]:
    """The classifier checkpoint whose weights are those of ``paths`` averaged: WiSE-FT's ``(1 - alpha) * A +
    alpha * B`` for two paths and an ``alpha``, a uniform soup otherwise. The first checkpoint gives the meta.

    Raises `MismatchedCheckpointsError` (one line naming both files) for other architectures or class lists."""
    mix = mixing_weights(len(paths), alpha)
    read = [read_for_average(p) for p in paths]
    for path, other in zip(paths[1:], read[1:]):
        if (why := mismatch(read[0], other)) is not None:
            raise MismatchedCheckpointsError(f"cannot average {paths[0]} and {path}: {why}; average checkpoints "
                                             "fine-tuned from one model on one class list")
    weights = average_weights([r["weights"] for r in read], mix)
    sources = [{"path": str(p), "weight": m} for p, m in zip(paths, mix)]
    return classifier_checkpoint(read[0]["meta"], weights, averaged_from=sources)


__all__ = ["MismatchedCheckpointsError", "average_checkpoints", "average_weights", "mixing_weights"]
