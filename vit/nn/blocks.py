"""Transformer building blocks shared by the ViT and the text Transformer.

Every block is a stack of residual branches. Pre-norm blocks (ViT, GPT-2) normalise each branch's input:
    x = x + attn(norm1(x));  x = x + mlp(norm2(x))
post-norm blocks (Vaswani et al. 2017), classes of their own, normalise after each residual sum:
    x = norm1(x + attn(x));  x = norm2(x + mlp(x))
A model builds its blocks from its config (`EncoderBlock.from_config`: a `ViTConfig` or a `TextConfig`, whose
block options have the same names). Asked for them, a block returns its attention weights beside its output,
as the kernel returns them: by argument, with no hooks and no state kept.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Self

import torch
from torch import Tensor, nn

from vit.nn.attention import KVCache, MultiHeadAttention
from vit.nn.configs import TextConfig, ViTConfig
from vit.nn.rope import Rotary


class QuickGELU(nn.Module):
    """OpenAI CLIP's approximation of GELU, x * sigmoid(1.702 x): its weights were trained with it."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


# The MLP's activation by its config name (`ViTConfig.act_layer`, `TextConfig.activation`).
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU, "gelu_tanh": partial(nn.GELU, approximate="tanh"), "quick_gelu": QuickGELU, "relu": nn.ReLU,
}


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


def attend(
    attn: MultiHeadAttention, *args: Tensor | None, return_attention: bool = False, **kwargs: Any
) -> tuple[Tensor, Tensor | None]:
    """``attn``'s output and, with ``return_attention``, its weights (else None): one shape either way."""
    out = attn(*args, return_attention=return_attention, **kwargs)
    return out if return_attention else (out, None)


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

    @classmethod
    def from_config(cls, config: ViTConfig | TextConfig, drop_path_rate: float = 0.0) -> Self:
        """The block its model's config describes; ``drop_path_rate`` is this block's own (it rises with depth)."""
        c = config
        return cls(
            c.embed_dim, c.num_heads, mlp_ratio=c.mlp_ratio, qkv_bias=c.qkv_bias, drop_rate=c.drop_rate,
            attn_drop_rate=c.attn_drop_rate, drop_path_rate=drop_path_rate, act_layer=ACTIVATIONS[c.act_layer],
            norm_eps=c.norm_eps, locality_attention=c.locality_attention, init_values=c.init_values,
        )

    def self_attention(
        self, x: Tensor, num_queries: int | None = None, **kwargs: Any
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of the first ``num_queries`` tokens of ``x`` (all by default) over all of them: (out, weights)."""
        queries, context = (x, None) if num_queries is None else (x[:, :num_queries], x)
        return attend(self.attn, queries, context, **kwargs)

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        num_queries: int | None = None,
        return_attention: bool = False,
        rope: Rotary | None = None,
        is_causal: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Update the tokens ``x`` (B, N, C); with ``return_attention`` also give the weights (B, H, n, N).

        ``num_queries=n`` updates and returns only the first n tokens while they still attend to
        all N: a ViT's last block needs nothing but the cls token. ``rope``: rotary positions (DINOv3).
        ``is_causal``: each token sees only those before it (CLIP's text tower), SDPA's flag on the fused path.
        """
        h, weights = self.self_attention(self.norm1(x), num_queries, key_padding_mask=key_padding_mask,
                                         attn_mask=attn_mask, rope=rope, return_attention=return_attention,
                                         is_causal=is_causal)
        x = x[:, :num_queries] + self.drop_path1(self.ls1(h))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return (x, weights) if return_attention else x


class PostNormEncoderBlock(EncoderBlock):
    """Self-attention then MLP, each residual sum followed by its LayerNorm, as in the 2017 paper."""

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        num_queries: int | None = None,
        return_attention: bool = False,
        rope: Rotary | None = None,
        is_causal: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """As `EncoderBlock.forward`, post-norm."""
        h, weights = self.self_attention(x, num_queries, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                                         rope=rope, return_attention=return_attention, is_causal=is_causal)
        x = self.norm1(x[:, :num_queries] + self.drop_path1(self.ls1(h)))
        x = self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))
        return (x, weights) if return_attention else x


class DecoderBlock(EncoderBlock):
    """An encoder block with cross-attention over the encoder output between its two branches; pre-norm.

    Its self-attention is causal. Takes EncoderBlock's arguments; the cross-attention gets the same
    bias, dropout and stochastic depth as the self-attention (LayerScale, if any, is on the other two branches).
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
        h, self_weights = attend(self.attn, self.norm1(x), is_causal=True, key_padding_mask=padding_mask,
                                    cache=self_cache, return_attention=return_attention)
        x = x + self.drop_path1(self.ls1(h))
        h, cross_weights = attend(self.cross_attn, self.cross_norm(x), memory, key_padding_mask=memory_padding_mask,
                                     cache=cross_cache, return_attention=return_attention)
        x = x + self.drop_path_cross(h)
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return (x, self_weights, cross_weights) if return_attention else x


class PostNormDecoderBlock(DecoderBlock):
    """Causal self-attention, cross-attention, then MLP, each residual sum followed by its LayerNorm."""

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
        """As `DecoderBlock.forward`, post-norm."""
        h, self_weights = attend(self.attn, x, is_causal=True, key_padding_mask=padding_mask, cache=self_cache,
                                    return_attention=return_attention)
        x = self.norm1(x + self.drop_path1(self.ls1(h)))
        h, cross_weights = attend(self.cross_attn, x, memory, key_padding_mask=memory_padding_mask,
                                     cache=cross_cache, return_attention=return_attention)
        x = self.cross_norm(x + self.drop_path_cross(h))
        x = self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))
        return (x, self_weights, cross_weights) if return_attention else x


__all__ = [
    "ACTIVATIONS", "DecoderBlock", "DropPath", "EncoderBlock", "LayerScale", "Mlp", "PostNormDecoderBlock",
    "PostNormEncoderBlock", "QuickGELU", "attend",
]
