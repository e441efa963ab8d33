"""Rotary position embeddings (Su et al., 2021) as DINOv3 uses them (timm's ``rope_type='dinov3'``).

Each patch at row i, column j of an h x w grid gets centred coordinates in [-1, 1]:
    y = 2 (i + 0.5) / h - 1,   x = 2 (j + 0.5) / w - 1
and each head's channels are turned by angles 2π·coord / period, periods = temperature^(2k / (head_dim/2)),
k = 0..head_dim/4 - 1: the first quarter of the frequencies for y, the next for x, each quarter used twice
(the "rotate half" layout: channel c pairs with channel c + head_dim/2). Prefix tokens (cls, storage
tokens) are not turned. The attention kernel applies a `Rotary` to its queries and keys by argument.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn


def rotate_half(x: Tensor) -> Tensor:
    """[x1, x2] -> [-x2, x1] over the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Rotary(NamedTuple):
    """The sines and cosines of each token, (prefix + h*w, head_dim) each. The prefix rows are sin 0, cos 1: they
    leave the prefix tokens as they are (exactly), so one multiply-add turns the whole sequence with no slicing
    and joining of prefix and patches, twice a block."""

    sin: Tensor
    cos: Tensor

    def apply(self, x: Tensor) -> Tensor:
        """Turn tokens ``x`` (B, heads, L, head_dim) by their angles, in fp32 as timm; L may be fewer than all
        tokens (only the first queries asked for)."""
        n = x.shape[2]
        return (x * self.cos[:n] + rotate_half(x) * self.sin[:n]).to(x.dtype)


class DinoV3Rope(nn.Module):
    """DINOv3's rotary embedding: no weights, only the periods (a non-persistent fp32 buffer)."""

    def __init__(self, head_dim: int, temperature: float = 100.0, num_prefix_tokens: int = 0) -> None:
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"rotary positions over 2 axes need a head_dim divisible by 4, got {head_dim}")
        self.head_dim, self.num_prefix_tokens = head_dim, num_prefix_tokens
        k = torch.arange(head_dim // 4, dtype=torch.float32)
        self.register_buffer("periods", temperature ** (2.0 * k / (head_dim // 2)), persistent=False)

    def forward(self, grid: tuple[int, int]) -> Rotary:
        """The rotation for an h x w patch grid."""
        h, w = grid
        axes = [(torch.arange(0.5, s, dtype=torch.float32) / s) for s in (h, w)]  # centres in (0, 1), on the CPU
        coords = torch.stack(torch.meshgrid(axes, indexing="ij"), dim=-1).flatten(0, 1) * 2.0 - 1.0  # (h*w, 2)
        periods = self.periods.float()
        angles = 2 * math.pi * coords.to(periods.device)[:, :, None] / periods  # (h*w, 2, head_dim/4)
        angles = angles.flatten(1)  # (h*w, head_dim/2): y's frequencies, then x's
        sin, cos = torch.cat([angles.sin()] * 2, dim=-1), torch.cat([angles.cos()] * 2, dim=-1)
        prefix = self.num_prefix_tokens
        return Rotary(torch.cat([sin.new_zeros(prefix, self.head_dim), sin]),
                      torch.cat([cos.new_ones(prefix, self.head_dim), cos]))

    def _apply(self, fn, *args, **kwargs):
        # `.half()` / `.to(bfloat16)` would round the periods: keep them fp32 (as timm does)
        module = super()._apply(fn, *args, **kwargs)
        if self.periods.dtype != torch.float32:
            self.periods = self.periods.float()
        return module

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, prefix={self.num_prefix_tokens}"
