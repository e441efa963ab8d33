"""Transformer building blocks shared by the ViT and the text Transformer.

Every block is a stack of residual branches. Pre-norm blocks (ViT, GPT-2) normalise each branch's input:
    x = x + attn(norm1(x));  x = x + mlp(norm2(x))
post-norm blocks (Vaswani et al. 2017) normalise after each residual sum:
    x = norm1(x + attn(x));  x = norm2(x + mlp(x))
The difference lives in one method, ``residual``: the `PostNorm` mixin overrides it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from vit.nn.attention import KVCache, MultiHeadAttention
from vit.nn.rope import Rotary


class Mlp(nn.Module):
    """Two linear layers with an activation between them: fc1 -> act -> fc2."""

    def __init__(
        self, embed_dim: int, hidden_dim: int, *, act_layer: type[nn.Module] = nn.GELU, drop_rate: float = 0.0
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, hidden_dim)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop_rate)
        self.fc2 = nn.Linear(hidden_dim, embed_dim)
        self.drop2 = nn.Dropout(drop_rate)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample, rescaling the survivors."""

    def __init__(self, drop_path_rate: float = 0.0) -> None:
        super().__init__()
        self.p = drop_path_rate

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask.div_(keep)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerScale(nn.Module):
    """A learned per-channel scale on a residual branch (Touvron et al., 2021, CaiT): ``x * gamma``."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.init_values = init_values
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma

    def extra_repr(self) -> str:
        return f"init_values={self.init_values}"


class EncoderBlock(nn.Module):
    """Self-attention then MLP, each in a pre-norm residual branch; ``locality_attention`` makes it LSA.

    ``init_values`` scales each branch by a learned LayerScale (``ls1.gamma``, ``ls2.gamma``; DINOv2, DeiT III).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        act_layer: Callable[[], nn.Module] = nn.GELU,
        norm_eps: float = 1e-6,
        locality_attention: bool = False,
        init_values: float | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.attn = MultiHeadAttention(
            embed_dim, num_heads, qkv_bias=qkv_bias, attn_drop_rate=attn_drop_rate, proj_drop_rate=drop_rate,
            locality_attention=locality_attention,
        )
        self.ls1 = LayerScale(embed_dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path_rate)
        self.norm2 = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.mlp = Mlp(embed_dim, int(embed_dim * mlp_ratio), act_layer=act_layer, drop_rate=drop_rate)
        self.ls2 = LayerScale(embed_dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path_rate)

    @staticmethod
    def residual(
        x: Tensor, norm: nn.Module, branch: Callable[[Tensor], Tensor], drop_path: nn.Module, keep: int | None = None
    ) -> Tensor:
        """Pre-norm: x + branch(norm(x)). With ``keep``, only the first ``keep`` tokens come out."""
        return x[:, :keep] + drop_path(branch(norm(x)))

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        num_queries: int | None = None,
        return_attention: bool = False,
        rope: Rotary | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Update the tokens ``x`` (B, N, C); with ``return_attention`` also give the weights (B, H, n, N).

        ``num_queries=n`` updates and returns only the first n tokens while they still attend to
        all N: a ViT's last block needs nothing but the cls token. ``rope``: rotary positions (DINOv3).
        """
        weights: list[Tensor] = []

        def attend(tokens: Tensor) -> Tensor:  # all N tokens; queries are the first num_queries
            queries, context = (tokens, None) if num_queries is None else (tokens[:, :num_queries], tokens)
            out = self.attn(queries, context, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                            return_attention=return_attention, rope=rope)
            if return_attention:
                out, w = out
                weights.append(w)
            return self.ls1(out)

        x = self.residual(x, self.norm1, attend, self.drop_path1, keep=num_queries)
        x = self.residual(x, self.norm2, lambda t: self.ls2(self.mlp(t)), self.drop_path2)
        return (x, weights[0]) if return_attention else x


class DecoderBlock(EncoderBlock):
    """An encoder block with cross-attention over the encoder output between its two branches; pre-norm.

    Its self-attention is causal. Takes EncoderBlock's arguments; the cross-attention gets the same
    bias, dropout and stochastic depth as the self-attention.
    """

    def __init__(self, embed_dim: int, num_heads: int, **kwargs: Any) -> None:
        super().__init__(embed_dim, num_heads, **kwargs)
        self.cross_norm = nn.LayerNorm(embed_dim, eps=self.norm1.eps)
        self.cross_attn = MultiHeadAttention(
            embed_dim, num_heads, qkv_bias=self.attn.qkv.bias is not None, cross=True,
            attn_drop_rate=self.attn.attn_drop.p, proj_drop_rate=self.attn.proj_drop.p,
        )
        self.drop_path_cross = DropPath(self.drop_path1.p)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        memory_padding_mask: Tensor | None = None,
        padding_mask: Tensor | None = None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor, Tensor]:
        """Update target tokens ``x`` (B, T, C) given the encoder output ``memory`` (B, S, C).

        ``padding_mask`` (B, T) marks target padding (needed for left padding). With caches, ``x``
        holds only the newest positions, and ``padding_mask`` covers every position decoded so far.
        ``return_attention`` also gives the self- and cross-attention weights, (B, H, T, T') and
        (B, H, T, S), from the kernel's explicit path; without it both run on the fused path.
        """
        weights: list[Tensor] = []

        def keep(out: Tensor | tuple[Tensor, Tensor]) -> Tensor:
            if not return_attention:
                return out
            weights.append(out[1])
            return out[0]

        self_attend = lambda h: keep(self.attn(
            h, is_causal=True, key_padding_mask=padding_mask, cache=self_cache, return_attention=return_attention
        ))
        cross_attend = lambda h: keep(self.cross_attn(
            h, memory, key_padding_mask=memory_padding_mask, cache=cross_cache, return_attention=return_attention
        ))
        x = self.residual(x, self.norm1, self_attend, self.drop_path1)
        x = self.residual(x, self.cross_norm, cross_attend, self.drop_path_cross)
        x = self.residual(x, self.norm2, self.mlp, self.drop_path2)
        return (x, *weights) if return_attention else x


class PostNorm:
    """Mixin for a block: each residual sum followed by its LayerNorm, as in the 2017 paper."""

    @staticmethod
    def residual(
        x: Tensor, norm: nn.Module, branch: Callable[[Tensor], Tensor], drop_path: nn.Module, keep: int | None = None
    ) -> Tensor:
        """Post-norm: norm(x + branch(x)). With ``keep``, only the first ``keep`` tokens come out."""
        return norm(x[:, :keep] + drop_path(branch(x)))


class PostNormEncoderBlock(PostNorm, EncoderBlock):
    """Self-attention then MLP, post-norm."""


class PostNormDecoderBlock(PostNorm, DecoderBlock):
    """Causal self-attention, cross-attention, then MLP, post-norm."""


__all__ = [
    "DecoderBlock", "DropPath", "EncoderBlock", "LayerScale", "Mlp", "PostNorm", "PostNormDecoderBlock",
    "PostNormEncoderBlock",
]
