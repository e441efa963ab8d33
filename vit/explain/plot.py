"""Draw attention maps: upsample a patch-grid map to the image, overlay it as a heat map, plot grids.

Figures are built as plain ``matplotlib.figure.Figure`` objects, not through pyplot: they save
with the Agg renderer and never touch the caller's backend (a notebook keeps its inline plots).
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor

from vit.reports import to_display_image  # the figures' own; here too, where the maps are drawn over it


def upsample_map(heat: Tensor, size: tuple[int, int]) -> Tensor:
    """Resize a map (h, w) or a batch (..., h, w) to ``size`` (H, W), bilinearly."""
    if heat.dim() < 2:
        raise ValueError(f"expected a map shaped (..., h, w), got {tuple(heat.shape)}")
    lead = heat.shape[:-2]
    flat = heat.float().reshape(-1, 1, *heat.shape[-2:])  # (M, 1, h, w)
    up = F.interpolate(flat, size=tuple(size), mode="bilinear", align_corners=False)
    return up.reshape(*lead, *size)


def normalise_map(heat: Tensor | np.ndarray) -> np.ndarray:
    """Scale a map to [0, 1] by its own min and max (a constant map becomes zeros)."""
    heat = heat.detach().cpu().float().numpy() if isinstance(heat, Tensor) else np.asarray(heat, np.float32)
    low, high = float(heat.min()), float(heat.max())
    return (heat - low) / (high - low) if high > low else np.zeros_like(heat)


def overlay(
    image: np.ndarray, heat: Tensor | np.ndarray, *, alpha: float = 0.5, cmap: str = "jet"
) -> np.ndarray:
    """Blend a heat map over an (H, W, 3) image in [0, 1]; the map is upsampled to fit."""
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"expected an (H, W, 3) image, got shape {image.shape}; see to_display_image")
    heat = torch.as_tensor(np.asarray(heat, np.float32) if not isinstance(heat, Tensor) else heat)
    if tuple(heat.shape) != image.shape[:2]:
        heat = upsample_map(heat, image.shape[:2])
    colours = matplotlib.colormaps[cmap](normalise_map(heat))[..., :3]  # (H, W, 3)
    return (1.0 - alpha) * image + alpha * colours


def plot_attention(
    image: np.ndarray,
    cls_maps: Tensor,
    *,
    layers: Sequence[int],
    heads: Sequence[int | str] | None = None,
    rollout: Tensor | None = None,
    rollout_label: str = "rollout",
    title: str | None = None,
    alpha: float = 0.5,
) -> Figure:
    """A figure for one image: the image and its rollout overlay, beside a layers x heads grid.

    ``cls_maps`` is (layers, heads, h, w) for this image; ``heads`` labels its columns.
    """
    if cls_maps.dim() != 4:
        raise ValueError(f"expected cls_maps shaped (layers, heads, h, w), got {tuple(cls_maps.shape)}")
    num_layers, num_heads = cls_maps.shape[:2]
    if len(layers) != num_layers:
        raise ValueError(f"{len(layers)} layer labels for {num_layers} layers of maps")
    heads = list(range(num_heads)) if heads is None else list(heads)

    cell = 1.6
    size = (cell * (num_heads + 1.3), cell * max(num_layers, 2) + 0.6)
    fig = Figure(figsize=size, layout="constrained")
    left, right = fig.subfigures(1, 2, width_ratios=[1.3, num_heads])
    side = left.subplots(2, 1, squeeze=False)[:, 0]
    side[0].imshow(image)
    side[0].set_title("input", fontsize=9)
    if rollout is not None:
        side[1].imshow(overlay(image, rollout, alpha=alpha))
        side[1].set_title(rollout_label, fontsize=9)
    for ax in side:
        ax.axis("off")

    grid = right.subplots(num_layers, num_heads, squeeze=False)
    for row, layer in enumerate(layers):
        for col, head in enumerate(heads):
            ax = grid[row, col]
            ax.imshow(overlay(image, cls_maps[row, col], alpha=alpha))
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(f"head {head}", fontsize=9)
            if col == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


__all__ = ["normalise_map", "overlay", "plot_attention", "to_display_image", "upsample_map"]
