"""Optimiser pieces for fine-tuning and training: AdamW parameter groups with layer decay, the LR schedule."""

from __future__ import annotations

import math
from typing import Any

from vit.nn.vision import VisionTransformer


def layer_id(name: str, depth: int) -> int:
    """Layer index for layer-wise LR decay: embeddings 0, block i -> i + 1, norms and head depth + 1."""
    if name.startswith(("patch_embed.", "cls_token", "pos_embed")):
        return 0
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    return depth + 1


def param_groups(
    model: VisionTransformer, lr: float, weight_decay: float, layer_decay: float | None = None
) -> list[dict[str, Any]]:
    """AdamW parameter groups: no decay on biases, norms, pos_embed and cls_token; per-layer lr.

    Each group's ``lr`` is set directly (``lr * layer_decay ** (depth + 1 - layer)``) because
    Lightning's scheduler stepping knows nothing of timm's ``lr_scale`` key.
    """
    depth = len(model.blocks)
    skip = model.no_weight_decay()
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim <= 1 or name in skip
        layer = layer_id(name, depth) if layer_decay is not None else depth + 1
        scale = layer_decay ** (depth + 1 - layer) if layer_decay is not None else 1.0
        key = (layer, no_decay)
        if key not in groups:
            groups[key] = {
                "params": [], "lr": lr * scale, "weight_decay": 0.0 if no_decay else weight_decay,
                "name": (f"layer{layer}_" if layer_decay is not None else "")
                + ("no_decay" if no_decay else "decay"),
            }
        groups[key]["params"].append(p)
    return [groups[k] for k in sorted(groups)]


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up from ~0 to 1, then cosine down to ``min_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
