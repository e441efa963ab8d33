"""Any token as the query: where one patch (or the cls token) of an image looks, or one token of a sentence.

>>> m = attention_from(vit_model, image, query=(2, 3), layer=-1, head="mean")   # patch row 2, column 3
>>> m.weights          # (h, w): that patch's attention over the patch grid
>>> m.prefix           # (P,): what it gives the prefix tokens, labelled by m.prefix_labels ("cls", "reg0", ...)
>>> t = attention_from(translator, "4 1 7 19 3", query=2, kind="cross")          # target token 2 over the source
>>> t.weights, t.labels                                                          # (S,), the source pieces

For an image, ``query`` is a patch ``(row, col)``, or a token index into the full sequence (0 is the cls token
when the model has one), or ``"cls"``. ``rollout=True`` reads the query's row of attention rollout (Abnar &
Zuidema, 2020) through every layer up to ``layer`` instead of one layer's weights. Prefix tokens (cls, registers)
are always kept apart from the patch map, so a view can show them labelled or drop them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import Tensor

from vit.explain.maps import collect_attention, rollout_layer, rollout_matrix
from vit.nn.vision import VisionTransformer

Query = tuple[int, int] | int | str


@dataclass
class QueryMap:
    """One query token's attention: over the patches (h, w) of an image, or over a sentence's tokens (S,)."""

    weights: Tensor  # (h, w) for an image; (keys,) for text
    query_label: str  # e.g. "patch (2, 3)", "cls", "target 2: '19'"
    labels: list[str] = field(default_factory=list)  # text: a piece per key; images: empty
    prefix: Tensor = field(default_factory=lambda: torch.zeros(0))  # (P,) weights on the prefix tokens
    prefix_labels: list[str] = field(default_factory=list)  # (P,) "cls", "reg0", ...

    def with_prefix(self) -> tuple[Tensor, list[str]]:
        """Prefix and patch weights in one flat (P + h*w,) vector, with a label per entry."""
        flat = self.weights.flatten()
        grid = [] if self.labels else [f"patch {i}" for i in range(flat.numel())]
        return torch.cat([self.prefix, flat]), self.prefix_labels + (self.labels or grid)


def prefix_labels(model: VisionTransformer) -> list[str]:
    """A name per prefix token, in the model's order: "cls", DeiT's "dist", then "reg0", "reg1", ... for registers."""
    names = [name for name, attr in (("cls", "cls_token"), ("dist", "dist_token"))
             if getattr(model, attr, None) is not None]
    return names + [f"reg{i}" for i in range(model.num_prefix_tokens - len(names))]


def _token_index(model: VisionTransformer, query: Query, grid: tuple[int, int]) -> tuple[int, str]:
    P, (h, w) = model.num_prefix_tokens, grid
    labels = prefix_labels(model)
    if isinstance(query, str):
        if query not in labels:
            raise ValueError(f"query {query!r} is not a prefix token of this model: it has {labels or 'none'}")
        return labels.index(query), query
    if isinstance(query, int):
        if not 0 <= query < P + h * w:
            raise ValueError(f"token index {query} is out of range for {P} prefix + {h}x{w} patch tokens")
        return query, labels[query] if query < P else f"patch ({(query - P) // w}, {(query - P) % w})"
    row, col = query
    if not (0 <= row < h and 0 <= col < w):
        raise ValueError(f"patch ({row}, {col}) is outside the {h}x{w} patch grid")
    return P + row * w + col, f"patch ({row}, {col})"


def _pick_head(weights: Tensor, head: int | str) -> Tensor:
    """(B, H, N, N) -> (B, N, N): one head or the mean."""
    if head == "mean":
        return weights.mean(dim=1)
    if not isinstance(head, int) or not -weights.shape[1] <= head < weights.shape[1]:
        raise ValueError(f"head must be 'mean' or an index below {weights.shape[1]}, got {head!r}")
    return weights[:, head]


def image_attention_from(
    model: VisionTransformer, image: Tensor, query: Query = "cls", layer: int = -1, head: int | str = "mean",
    *, rollout: bool = False,
) -> QueryMap:
    """A query token's attention over one image's patch grid; see the module docstring."""
    images = image[None] if image.dim() == 3 else image
    if images.shape[0] != 1:
        raise ValueError(f"attention_from explains one image; got a batch of {images.shape[0]}")
    maps = collect_attention(model, images)  # every layer: (L, 1, H, N, N)
    depth = maps.weights.shape[0]
    if not -depth <= layer < depth:
        raise ValueError(f"layer {layer} is out of range for a model of depth {depth}")
    index, label = _token_index(model, query, maps.grid)
    if rollout:
        # Heads fused as asked ("mean", or one head's weights alone), through layers 0..layer.
        chosen = maps.weights[: layer % depth + 1]  # (layers, 1, H, N, N)
        per_layer = [rollout_layer(w if head == "mean" else w[:, [head]], "mean") for w in chosen]
        row = rollout_matrix(per_layer)[0, index]  # (N,)
    else:
        row = _pick_head(maps.weights[layer], head)[0, index]  # (N,)
    P = model.num_prefix_tokens
    return QueryMap(weights=row[P:].reshape(maps.grid).float(), query_label=label, prefix=row[:P].float(),
                    prefix_labels=prefix_labels(model))


def text_attention_from(
    translator: Any, source: str, query: int, layer: int = -1, head: int | str = "mean", *,
    kind: str = "cross", target: str | None = None, beam_size: int = 1,
) -> QueryMap:
    """A token's attention in one sentence: a target token's over the source (cross) or the earlier target
    (decoder), or a source token's over the source (encoder). Greedy decoding unless ``target`` is given."""
    from vit.explain.text import translation_attention

    att = translation_attention(translator, source, target, beam_size=beam_size)
    weights = att.select(kind, layer, head)  # (rows, columns)
    rows, columns = att.labels(kind)
    if not -len(rows) <= query < len(rows):
        raise ValueError(f"token index {query} is out of range for {len(rows)} {kind} query tokens {rows}")
    side = "source" if kind == "encoder" else "target"
    return QueryMap(weights=weights[query].float(), query_label=f"{side} {query % len(rows)}: {rows[query]!r}",
                    labels=list(columns))


def mass_mask(weights: Tensor, keep: float) -> Tensor:
    """DINO's thresholded attention (Caron et al., 2021): the fewest entries that hold ``keep`` of the mass.

    Entries are ranked by weight; those whose running share of the total, counted from the largest, is
    still below ``keep`` are True, and the one that crosses it too. ``keep`` 0 keeps nothing, 1 everything.
    """
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"keep must be a share of the attention mass in [0, 1], got {keep}")
    flat = weights.flatten().float()
    values, order = flat.sort(descending=True)
    before = (values.cumsum(0) - values) / values.sum().clamp_min(1e-12)  # share held by the larger entries
    kept = torch.zeros_like(flat, dtype=torch.bool)
    kept[order] = before < keep
    return kept.reshape(weights.shape)


def plot_query(m: QueryMap, image: Any = None, *, keep: float = 0.0, show_prefix: bool = True,
               grid_query: tuple[int, int] | None = None, alpha: float = 0.5) -> Figure:
    """A static figure of one query's attention: the image overlay (or a bar per token), the mass mask
    kept at ``keep`` (0: no mask), and the prefix tokens' weights beside it unless ``show_prefix`` is off."""
    from vit.explain.plot import overlay

    mask = mass_mask(m.weights, keep) if keep > 0 else None
    with_bar = show_prefix and len(m.prefix_labels) > 0
    size = (max(4.0, 0.45 * len(m.labels)), 3.0) if m.labels else (4.8 if with_bar else 3.6, 3.6)
    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(1, 2, width_ratios=[3, 1]) if with_bar else [fig.add_subplot()]
    ax = axes[0]
    if m.labels:  # a sentence: one bar per key token, the kept ones dark
        colours = ["tab:blue" if mask is None or mask[i] else "lightsteelblue" for i in range(len(m.labels))]
        ax.bar(range(len(m.labels)), m.weights.numpy(), color=colours)
        ax.set_xticks(range(len(m.labels)), m.labels, rotation=90, fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_ylabel("attention")
    else:
        h, w = m.weights.shape
        base = np.full((h * 16, w * 16, 3), 0.5) if image is None else np.asarray(image, dtype=np.float64)
        shown = overlay(base, m.weights, alpha=alpha)
        if mask is not None:  # dim what the mask leaves out
            dropped = (~mask).float()[None, None]  # (1, 1, h, w), nearest-neighbour up to the image
            outside = torch.nn.functional.interpolate(dropped, size=base.shape[:2])[0, 0].bool().numpy()
            shown[outside] *= 0.25
        ax.imshow(shown)
        ax.axis("off")
        if grid_query is not None:  # outline the query patch
            ph, pw = base.shape[0] / h, base.shape[1] / w
            r, c = grid_query
            ax.add_patch(Rectangle((c * pw - 0.5, r * ph - 0.5), pw, ph, fill=False, edgecolor="white", lw=2))
    title = f"{m.query_label}" + (f", {keep:.0%} of the mass" if mask is not None else "")
    ax.set_title(title, fontsize=9)
    if with_bar:
        axes[1].barh(range(len(m.prefix_labels)), m.prefix.numpy(), color="tab:orange")
        axes[1].set_yticks(range(len(m.prefix_labels)), m.prefix_labels, fontsize=8)
        axes[1].set_xlim(0, 1)
        axes[1].invert_yaxis()
        axes[1].set_title("prefix", fontsize=9)
    return fig


def attention_from(model: Any, x: Any, query: Query = "cls", layer: int = -1, head: int | str = "mean",
                   **options: Any) -> QueryMap:
    """One query's attention for either model: a ViT and an image, or a translator and a source sentence."""
    if isinstance(model, VisionTransformer):
        return image_attention_from(model, x, query, layer, head, **options)
    if hasattr(model, "model") and hasattr(model, "source_tokenizer"):
        if not isinstance(query, int):
            raise ValueError(f"a sentence's query is a token index, got {query!r}")
        return text_attention_from(model, x, query, layer, head, **options)
    raise TypeError(f"expected a vit VisionTransformer or a Translator, got {type(model).__name__}")


__all__ = [
    "QueryMap", "attention_from", "image_attention_from", "mass_mask", "plot_query", "prefix_labels",
    "text_attention_from",
]
