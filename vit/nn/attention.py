"""Multi-head scaled dot-product attention: the one kernel every Transformer in `vit` uses.

One forward pass, one step a concern:

    x (B, Lq, C), context (B, Lk, C)
      -> project: q (B, H, Lq, D); k, v (B, H, Lk, D)   a `KVCache` adds the past steps' keys and values
      -> rotate q and k by their positions                (`vit.nn.rope.Rotary`, DINOv3; optional)
      -> fold LSA's learned temperature into q            (`locality_scale`; optional)
      -> mask: one additive mask, or SDPA's causal flag   (`merge_masks`)
      -> kernel: softmax(q kᵀ/√D + mask) v                (B, H, Lq, D), and the weights (B, H, Lq, Lk) if asked
      -> merge the heads, proj                            (B, Lq, C)

The kernel has two paths through the same weights:

* the fused path calls ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels);
* the explicit path computes ``softmax(QKᵀ/√d)·V`` and also returns the attention weights,
  shaped (batch, heads, queries, keys). Ask for it with ``return_attention=True``; setting a layer's
  ``fused_attn = False`` (timm's switch) takes it without returning the weights.

Mask convention (the same as ``torch.nn.MultiheadAttention``): a boolean mask marks with
``True`` the positions a query may **not** attend to; a float mask is added to the scores.
A query whose keys are all masked attends to nothing and outputs zeros, never NaN.

``locality_attention=True`` turns on Locality Self-Attention (Lee et al., 2021, "Vision Transformer
for Small-Size Datasets"): each query is barred from its own key, and the logits are scaled by a
learned per-head ``learned_scale`` (1/τ, τ starting at √head_dim) instead of the fixed 1/√head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit.nn.rope import Rotary


@dataclass
class KVCache:
    """Keys and values kept between decoding steps, each (B, heads, keys, head_dim).

    For self-attention every call appends the new step's keys and values; for
    cross-attention the first call projects the context and later calls reuse it.
    """

    k: Tensor | None = None
    v: Tensor | None = None

    def update(self, k: Tensor, v: Tensor, *, append: bool) -> tuple[Tensor, Tensor]:
        """Keep this step's keys and values, after the past ones with ``append`` (self-attention); return all."""
        if append and self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v

    def reorder(self, index: Tensor) -> None:
        """Select batch rows in place (beam search keeps the surviving beams)."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


def causal_mask(num_queries: int, num_keys: int, device: torch.device | None = None) -> Tensor:
    """Boolean (queries, keys) mask, True above the diagonal aligned to the last key.

    With a KV cache the queries are the last ``num_queries`` positions of the sequence,
    so query i may see keys up to ``num_keys - num_queries + i``.
    """
    offset = num_keys - num_queries
    q = torch.arange(num_queries, device=device)[:, None]
    k = torch.arange(num_keys, device=device)[None, :]
    return k > q + offset


def merge_masks(
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    is_causal: bool,
    num_queries: int,
    num_keys: int,
    dtype: torch.dtype,
    device: torch.device,
    exclude_self: bool = False,
) -> Tensor | None:
    """Combine every mask into one additive float mask broadcastable to (B, H, Lq, Lk).

    ``exclude_self`` masks query i from key i: the queries are the first ``num_queries`` keys.
    Returns None when nothing is masked, so the caller can keep the unmasked fast path.
    """
    masks = []
    if attn_mask is not None:
        if attn_mask.dim() not in (2, 3, 4):
            raise ValueError(
                f"attn_mask must have 2 (Lq, Lk), 3 (B*H or B, Lq, Lk) or 4 dims, got shape "
                f"{tuple(attn_mask.shape)}"
            )
        masks.append(attn_mask if attn_mask.dim() != 3 else attn_mask[:, None])
    if key_padding_mask is not None:
        if key_padding_mask.dim() != 2 or key_padding_mask.shape[-1] != num_keys:
            raise ValueError(
                f"key_padding_mask must be (batch, {num_keys}), got {tuple(key_padding_mask.shape)}"
            )
        masks.append(key_padding_mask[:, None, None, :])
    if is_causal and num_queries > 1:
        masks.append(causal_mask(num_queries, num_keys, device))
    if exclude_self:
        masks.append(torch.eye(num_queries, num_keys, dtype=torch.bool, device=device))  # (Lq, Lk)
    if not masks:
        return None

    merged = None
    for mask in masks:
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(mask, float("-inf"))
        else:
            mask = mask.to(dtype)
        merged = mask if merged is None else merged + mask
    return merged


def locality_scale(q: Tensor, learned_scale: Tensor) -> Tensor:
    """LSA's learned temperature folded into the queries (B, H, Lq, D): head h's queries times its 1/τ_h.

    Folded into q because SDPA's ``scale`` must be one float; the kernel then scales by 1. Cast so that an
    autocast bf16 q is not promoted to fp32 against the fp32 parameter.
    """
    return q * learned_scale.to(q.dtype).view(-1, 1, 1)  # (H, 1, 1) over (B, H, Lq, D)


def linear_rows(layer: nn.Module, x: Tensor, rows: slice) -> Tensor:
    """``layer(x)[..., rows]``, computing those output rows alone; a layer with adapters (`vit.nn.lora`) adds its
    own update to them."""
    if isinstance(layer, nn.Linear):
        b = layer.bias
        return F.linear(x, layer.weight[rows], None if b is None else b[rows])
    return layer(x, rows=rows)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with timm's parameter layout.

    Self-attention (the default) owns a fused ``qkv`` projection whose rows are
    [q; k; v], each ``num_heads × head_dim``, as timm and torchvision store it.
    Cross-attention (``cross=True``) owns separate ``q`` and ``kv`` projections, the
    latter's rows ordered [k; v]. Both end in an output projection ``proj``.
    ``locality_attention`` (self-attention only) adds the per-head parameter ``learned_scale`` (heads,).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int = 8,
        *,
        qkv_bias: bool = True,
        attn_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        cross: bool = False,
        context_dim: int | None = None,
        locality_attention: bool = False,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if locality_attention and cross:
            raise ValueError("locality_attention masks each token's own key: it needs self-attention, not cross")
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scale = self.head_dim**-0.5
        self.cross = cross
        self.locality_attention = locality_attention
        # LSA's learned temperature, stored as its inverse (the logits' multiplier) as the authors' code does.
        # One value per head: 1-D, so the optimiser groups leave it out of weight decay, which would pull it
        # towards 0, i.e. towards uniform attention.
        self.learned_scale = nn.Parameter(torch.full((num_heads,), self.scale)) if locality_attention else None
        if cross:
            self.q = nn.Linear(embed_dim, embed_dim, bias=qkv_bias)
            self.kv = nn.Linear(context_dim or embed_dim, 2 * embed_dim, bias=qkv_bias)
        else:
            self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=qkv_bias)
        # False: the explicit path even without return_attention. timm's name for the same switch. On a CPU in
        # bf16 without AMX SDPA's flash kernel is slower than the two bf16 matmuls (`Bf16Classifier`; the figures:
        # docs/inference.md, "bf16 without AMX").
        self.fused_attn = True
        self.attn_drop = nn.Dropout(attn_drop_rate)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.proj_drop = nn.Dropout(proj_drop_rate)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        # (B, L, n*C) -> (n, B, H, L, D)
        B, L, _ = x.shape
        return x.reshape(B, L, n, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)

    def _project(
        self, x: Tensor, context: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries from ``x``, keys and values from ``context`` (else ``x``): (B, H, L, D) each.

        With a ``cache``, self-attention appends this step's keys and values to the past ones; cross-attention
        projects the context at the first step and reuses it after.
        """
        if self.cross and cache is not None and cache.k is not None:
            return self._heads(self.q(x), 1)[0], cache.k, cache.v
        q, k, v = self._qkv(x, context)
        if cache is not None:
            k, v = cache.update(k, v, append=not self.cross)
        return q, k, v

    def _qkv(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        if self.cross:
            if context is None:
                raise ValueError("cross-attention needs a context tensor")
            q = self._heads(self.q(x), 1)[0]
            k, v = self._heads(self.kv(context), 2).unbind(0)
        elif context is None:
            q, k, v = self._heads(self.qkv(x), 3).unbind(0)
        else:
            # Self-attention weights with queries from a subset of the keys' tokens
            # (e.g. only the cls token in a ViT's last block): split the fused projection.
            C = x.shape[-1]
            q = self._heads(linear_rows(self.qkv, x, slice(None, C)), 1)[0]
            k, v = self._heads(linear_rows(self.qkv, context, slice(C, None)), 2).unbind(0)
        return q, k, v

    def _mask(
        self, attn_mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool, q: Tensor, num_keys: int,
        explicit: bool,
    ) -> tuple[Tensor | None, bool]:
        """One additive mask for the kernel (None: nothing masked), and whether SDPA takes causality as its flag.

        A plain causal mask over a full square goes to SDPA as the flag, so flash kernels apply. LSA masks the
        diagonal: no token attends to itself.
        """
        locality = self.learned_scale is not None
        num_queries = q.shape[2]
        if (is_causal and not explicit and not locality and attn_mask is None and key_padding_mask is None
                and num_queries == num_keys):
            return None, True
        mask = merge_masks(attn_mask, key_padding_mask, is_causal, num_queries, num_keys, q.dtype, q.device,
                           exclude_self=locality)
        return mask, False

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, causal: bool, scale: float | None,
        explicit: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """The kernel: softmax(q kᵀ · scale + mask) v (B, H, Lq, D), with the weights (B, H, Lq, Lk) if ``explicit``.

        ``scale`` None is 1/√D; ``causal`` is SDPA's flag (`_mask` never sets it for the explicit path).
        """
        empty = None
        if mask is not None:  # a query with every key masked would softmax to NaN: unmask it, zero its output
            empty = torch.isneginf(mask).all(dim=-1, keepdim=True)
            mask = mask.masked_fill(empty, 0.0)
        if explicit:
            scores = (q * (self.scale if scale is None else scale)) @ k.transpose(-2, -1)  # (B, H, Lq, Lk)
            weights = (scores if mask is None else scores + mask).softmax(dim=-1)
            if empty is not None:
                weights = weights.masked_fill(empty, 0.0)
            return self.attn_drop(weights) @ v, weights
        dropout = self.attn_drop.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=scale)
        return (out if empty is None else out.masked_fill(empty, 0.0)), None

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        return_attention: bool = False,
        cache: KVCache | None = None,
        rope: Rotary | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``x`` (B, Lq, C) to ``context`` (B, Lk, C), or to ``x`` itself.

        Returns the output (B, Lq, C), and with ``return_attention=True`` also the
        weights (B, H, Lq, Lk). ``cache`` enables incremental decoding. ``rope`` turns the queries and keys
        by their patch's rotary angles (`vit.nn.rope`); the queries are the sequence's first Lq tokens.
        """
        if cache is not None and self.learned_scale is not None:
            raise ValueError("locality_attention aligns query i with key i, which a KV cache breaks")
        B, Lq, C = x.shape
        q, k, v = self._project(x, context, cache)  # (B, H, Lq, D), (B, H, Lk, D), (B, H, Lk, D)
        if rope is not None:
            q, k = rope.apply(q), rope.apply(k)
        scale = None  # SDPA's own 1/√D
        if self.learned_scale is not None:
            q, scale = locality_scale(q, self.learned_scale), 1.0
        explicit = return_attention or not self.fused_attn
        mask, causal = self._mask(attn_mask, key_padding_mask, is_causal, q, k.shape[2], explicit)
        out, weights = self._attend(q, k, v, mask, causal=causal, scale=scale, explicit=explicit)
        out = out.transpose(1, 2).reshape(B, Lq, C)  # (B, H, Lq, D) -> (B, Lq, C)
        out = self.proj_drop(self.proj(out))
        return (out, weights) if return_attention else out
