"""Where the translation model looks: its three kinds of attention, every axis labelled by token.

The weights come from the kernel's explicit path by argument (``Seq2SeqTransformer.forward_attention``
with teacher forcing, ``greedy_decode`` / ``beam_search`` with ``return_attention=True`` per generated
step); nothing here hooks the model.

>>> att = translation_attention(translator, "4 1 7 19 3")                 # greedy, each step's weights
>>> att = translation_attention(translator, "4 1 7", target="7 1 4")      # teacher forcing
>>> att.select("cross", layer=-1, head="mean")                            # (T, S): target rows, source columns
>>> plot_alignment(att); plot_heads(att, "decoder"); plot_top_sources(att)

Shapes, for one sentence:
    encoder  (L_enc, H, S, S)   source self-attention; rows and columns are source tokens
    decoder  (L_dec, H, T, T)   target causal self-attention; row t is the query that predicts target[t],
                                column j is what step j was fed (<bos>, then target[:-1])
    cross    (L_dec, H, T, S)   target rows over source columns: the alignment
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.figure import Figure
from torch import Tensor

KINDS = ("encoder", "decoder", "cross")
Head = int | str  # a head index, or "mean" for the average of the heads


@dataclass
class SentenceAttention:
    """One sentence pair's attention weights with the token labels of every axis."""

    source: list[str]  # (S,) source pieces
    target: list[str]  # (T,) output pieces, EOS included when produced
    target_inputs: list[str]  # (T,) what each step was fed: <bos>, then target[:-1]
    encoder: Tensor  # (L_enc, H, S, S)
    decoder: Tensor  # (L_dec, H, T, T)
    cross: Tensor  # (L_dec, H, T, S)
    mode: str = "teacher forcing"  # or "greedy", "beam 4"
    translation: str = ""  # the target as text

    def weights(self, kind: str) -> Tensor:
        """All layers and heads of one kind, (L, H, rows, columns)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        return getattr(self, kind)

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of one kind's maps."""
        self.weights(kind)
        return {
            "encoder": (self.source, self.source),
            "decoder": (self.target, self.target_inputs),
            "cross": (self.target, self.source),
        }[kind]

    def select(self, kind: str = "cross", layer: int = -1, head: Head = "mean") -> Tensor:
        """One layer's map (rows, columns): a head, or the heads' mean."""
        weights = self.weights(kind)
        if not -len(weights) <= layer < len(weights):
            raise ValueError(f"layer {layer} is out of range for {len(weights)} {kind} layers")
        per_head = weights[layer]  # (H, rows, columns)
        if head == "mean":
            return per_head.mean(dim=0)
        if not isinstance(head, int) or not -len(per_head) <= head < len(per_head):
            raise ValueError(f"head must be 'mean' or an index below {len(per_head)}, got {head!r}")
        return per_head[head]

    def to_dict(self) -> dict[str, Any]:
        """Labels and weights as nested lists, for JSON."""
        out: dict[str, Any] = {"mode": self.mode, "translation": self.translation, "source": self.source,
                               "target": self.target, "target_inputs": self.target_inputs}
        for kind in KINDS:
            out[kind] = self.weights(kind).float().tolist()  # [layer][head][row][column]
        return out


def _as_ids(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.encode(text)
    if not ids:
        raise ValueError(f"{text!r} gives no tokens: give a sentence with at least one known piece")
    return ids


@torch.no_grad()
def translation_attention(
    translator: Any,
    source: str,
    target: str | None = None,
    *,
    beam_size: int = 1,
    max_len: int | None = None,
    eos_id: int = 3,
    bos_id: int = 2,
) -> SentenceAttention:
    """Attention for one sentence: teacher forcing on ``target`` if given, else each decoding step's.

    ``translator`` is anything with ``model`` (a Seq2SeqTransformer), ``source_tokenizer`` and
    ``target_tokenizer``: a trained ``vit.tasks.Translator``. Decoding is greedy, or beam search
    with ``beam_size`` > 1 (the winner's own history). The model runs in eval mode.
    """
    model, src_tok, tgt_tok = translator.model, translator.source_tokenizer, translator.target_tokenizer
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        src_ids = _as_ids(src_tok, source)
        src = torch.tensor([src_ids], device=device)
        if target is not None:
            out_ids = [*_as_ids(tgt_tok, target), eos_id]
            tgt_in = torch.tensor([[bos_id, *out_ids[:-1]]], device=device)
            _, att = model.forward_attention(src, tgt_in)
            mode = "teacher forcing"
        else:
            decode = dict(bos_id=bos_id, eos_id=eos_id, max_len=max_len, return_attention=True)
            if beam_size == 1:
                ids, att = model.greedy_decode(src, **decode)
                mode = "greedy"
            else:
                ids, att = model.beam_search(src, beam_size=beam_size, **decode)
                mode = f"beam {beam_size}"
            out_ids = ids[0].tolist()
            if eos_id in out_ids:  # rows after EOS are padding steps
                out_ids = out_ids[: out_ids.index(eos_id) + 1]
    finally:
        model.train(was_training)
    T = len(out_ids)
    return SentenceAttention(
        source=src_tok.pieces(src_ids), target=tgt_tok.pieces(out_ids),
        target_inputs=tgt_tok.pieces([bos_id, *out_ids[:-1]]),
        encoder=att.encoder[:, 0].cpu(), decoder=att.decoder[:, 0, :, :T, :T].cpu(),
        cross=att.cross[:, 0, :, :T].cpu(), mode=mode, translation=tgt_tok.decode(out_ids),
    )


def alignment_accuracy(cross: Tensor, expected: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """How often each head's argmax over the source is the expected source position.

    ``cross`` (L, B, H, T, S), ``expected`` (B, T) source indices, ``valid`` (B, T) the rows to score.
    Returns per-head accuracy (L, H) and the accuracy of the heads' mean map per layer (L,).
    """
    if valid is None:
        valid = torch.ones_like(expected, dtype=torch.bool)
    n = valid.sum().clamp_min(1)
    hits = cross.argmax(dim=-1).eq(expected[None, :, None]) & valid[None, :, None]  # (L, B, H, T)
    per_head = hits.sum(dim=(1, 3)).float() / n
    mean_hits = cross.mean(dim=2).argmax(dim=-1).eq(expected[None]) & valid[None]  # (L, B, T)
    return per_head, mean_hits.sum(dim=(1, 2)).float() / n


@torch.no_grad()
def mirrored_alignment_accuracy(
    translator: Any, sources: list[str], *, decode: bool = False, bos_id: int = 2, eos_id: int = 3
) -> tuple[Tensor, Tensor]:
    """The reversal task's known answer: how often output token t attends most to source token S-1-t.

    Teacher forcing on the reversed source, or with ``decode=True`` each greedy step's weights.
    Rows past the source length (EOS, padding) are not scored. Returns ``alignment_accuracy``'s
    per-head (L, H) and head-mean (L,) accuracies over all ``sources``.
    """
    model, tok = translator.model, translator.source_tokenizer
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids = [_as_ids(tok, s) for s in sources]
    B, S = len(ids), max(map(len, ids))
    src = torch.full((B, S), model.pad_id, dtype=torch.long)
    for i, row in enumerate(ids):
        src[i, : len(row)] = torch.tensor(row)
    lengths = torch.tensor([len(row) for row in ids])
    try:
        if decode:
            _, att = model.greedy_decode(src.to(device), bos_id=bos_id, eos_id=eos_id, max_len=S + 1,
                                         return_attention=True)
        else:
            # The target is the source's words reversed, in the target vocabulary's ids.
            tgt_in = torch.full((B, S), model.pad_id, dtype=torch.long)
            for i, text in enumerate(sources):
                target = _as_ids(translator.target_tokenizer, " ".join(text.split()[::-1]))
                tgt_in[i, : len(target)] = torch.tensor([bos_id, *target[:-1]])
            _, att = model.forward_attention(src.to(device), tgt_in.to(device))
    finally:
        model.train(was_training)
    T = min(att.cross.shape[3], S)
    t = torch.arange(T)[None, :]
    expected = (lengths[:, None] - 1 - t).clamp(min=0)  # (B, T) mirrored source index
    valid = t < lengths[:, None]
    return alignment_accuracy(att.cross[:, :, :, :T].cpu(), expected, valid)


def alignment_text(att: SentenceAttention, layer: int = -1, head: Head = "mean", k: int = 1) -> str:
    """One line per target token: the source tokens it attends to most, with their weights."""
    weights = att.select("cross", layer, head)
    lines = []
    for t, piece in enumerate(att.target):
        top = weights[t].topk(min(k, weights.shape[-1]))
        picks = ", ".join(f"{att.source[j]!s} ({w:.2f})" for w, j in zip(top.values.tolist(), top.indices.tolist()))
        lines.append(f"{piece} <- {picks}")
    return "\n".join(lines)


# ---- figures: plain matplotlib Figures (Agg), as vit.explain.plot draws them -------------------------
def _heatmap(ax: Any, weights: Tensor, rows: list[str], columns: list[str], *, ticks: bool = True,
             vmax: float = 1.0) -> Any:
    image = ax.imshow(weights.float().numpy(), cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
    if ticks:
        ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=8)
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    return image


def _head_name(head: Head) -> str:
    return "mean of heads" if head == "mean" else f"head {head}"


def plot_alignment(att: SentenceAttention, layer: int = -1, head: Head = "mean") -> Figure:
    """Source × target heatmap of one layer's cross-attention (a head or the heads' mean)."""
    rows, columns = att.labels("cross")
    fig = Figure(figsize=(max(4.5, 2.0 + 0.35 * len(columns)), max(3.5, 1.6 + 0.35 * len(rows))),
                 layout="constrained")
    ax = fig.add_subplot()
    image = _heatmap(ax, att.select("cross", layer, head), rows, columns)
    ax.set_xlabel("source")
    ax.set_ylabel("target (output)")
    ax.set_title(f"cross-attention, layer {layer % len(att.cross)}\n{_head_name(head)}, {att.mode}", fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.8)
    return fig


def plot_heads(att: SentenceAttention, kind: str = "cross", *, mean: bool = True) -> Figure:
    """Layers × heads grid of one kind's maps, with the heads' mean as a last column.

    One colour scale for the grid, from 0 to the largest weight in it, so diffuse heads stay visible.
    """
    weights = att.weights(kind)  # (L, H, rows, columns)
    vmax = max(float(weights.max()), 1e-6)
    L, H = weights.shape[:2]
    rows, columns = att.labels(kind)
    ncols = H + int(mean)
    fig = Figure(figsize=(2.2 * ncols, 2.2 * L + 0.6), layout="constrained")
    axes = fig.subplots(L, ncols, squeeze=False)
    for layer in range(L):
        for col in range(ncols):
            ax = axes[layer, col]
            head: Head = "mean" if col == H else col
            # Token labels on the left column and bottom row only, where they can be read.
            _heatmap(ax, att.select(kind, layer, head), rows, columns, ticks=False, vmax=vmax)
            if layer == L - 1:
                ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=6)
            if col == 0:
                ax.set_yticks(range(len(rows)), rows, fontsize=6)
                ax.set_ylabel(f"layer {layer}", fontsize=9)
            if layer == 0:
                ax.set_title(_head_name(head), fontsize=9)
    fig.suptitle(f"{kind} attention ({att.mode}); colour scale 0 to {vmax:.2f}", fontsize=10)
    return fig


def plot_top_sources(att: SentenceAttention, layer: int = -1, head: Head = "mean", k: int = 3) -> Figure:
    """Each target token with its step's top-k source tokens, shaded by weight."""
    weights = att.select("cross", layer, head)  # (T, S)
    k = min(k, weights.shape[-1])
    T = len(att.target)
    fig = Figure(figsize=(2.0 + 1.6 * k, 0.6 + 0.32 * T), layout="constrained")
    ax = fig.add_subplot()
    ax.set_xlim(-0.5, k + 0.5)
    ax.set_ylim(T - 0.5, -0.5)
    ax.axis("off")
    shade = colormaps["Blues"]  # no colour bar: each box prints its weight
    for t, piece in enumerate(att.target):
        ax.text(0, t, piece, ha="center", va="center", fontsize=9, fontweight="bold")
        top = weights[t].topk(k)
        for rank, (w, j) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
            ax.text(rank, t, f"{att.source[j]} {w:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if w > 0.6 else "black",
                    bbox=dict(boxstyle="round,pad=0.25", facecolor=shade(0.15 + 0.85 * w), edgecolor="none"))
    ax.text(0, -0.9, "target", ha="center", fontsize=8, style="italic")
    heading = f"top {k} source tokens (layer {layer % len(att.cross)}, {_head_name(head)})"
    ax.text((k + 1) / 2, -0.9, heading, ha="center", fontsize=8, style="italic")
    return fig


def figure_to_array(fig: Figure) -> np.ndarray:
    """Render a Figure to an (H, W, 4) uint8 array (a check that it draws, and for tests)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())


__all__ = [
    "KINDS",
    "SentenceAttention",
    "alignment_accuracy",
    "alignment_text",
    "figure_to_array",
    "mirrored_alignment_accuracy",
    "plot_alignment",
    "plot_heads",
    "plot_top_sources",
    "translation_attention",
]
