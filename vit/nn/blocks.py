"""Transformer building blocks shared by the ViT and the text Transformer."""

from __future__ import annotations

from torch import Tensor, nn

from vit.nn.attention import KVCache, MultiHeadAttention


class Mlp(nn.Module):
    """Two linear layers with an activation between them: fc1 -> act -> fc2."""

    def __init__(
        self, dim: int, hidden_dim: int, *, act_layer: type[nn.Module] = nn.GELU, drop: float = 0.0
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample, rescaling the survivors."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask.div_(keep)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class EncoderBlock(nn.Module):
    """Self-attention then MLP, each in a residual branch; pre-norm by default.

    Pre-norm:  x + attn(norm1(x)),  then  x + mlp(norm2(x))   (ViT, GPT-2)
    Post-norm: norm1(x + attn(x)),  then  norm2(x + mlp(x))   (Vaswani et al. 2017)
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_eps: float = 1e-6,
        norm_first: bool = True,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = MultiHeadAttention(
            dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop
        )
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)
        self.drop_path2 = DropPath(drop_path)

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        num_queries: int | None = None,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Update the tokens ``x`` (B, N, C).

        ``num_queries=n`` updates and returns only the first n tokens while they still
        attend to all N: a ViT's last block needs nothing but the cls token.
        """
        masks = dict(key_padding_mask=key_padding_mask, attn_mask=attn_mask)
        if self.norm_first:
            h = self.norm1(x)
            if num_queries is None:
                out = self.attn(h, return_attention=return_attention, **masks)
            else:
                x = x[:, :num_queries]
                out = self.attn(h[:, :num_queries], h, return_attention=return_attention, **masks)
            out, weights = out if return_attention else (out, None)
            x = x + self.drop_path1(out)
            x = x + self.drop_path2(self.mlp(self.norm2(x)))
        else:
            if num_queries is None:
                out = self.attn(x, return_attention=return_attention, **masks)
            else:
                out = self.attn(x[:, :num_queries], x, return_attention=return_attention, **masks)
                x = x[:, :num_queries]
            out, weights = out if return_attention else (out, None)
            x = self.norm1(x + self.drop_path1(out))
            x = self.norm2(x + self.drop_path2(self.mlp(x)))
        return (x, weights) if return_attention else x


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention over the encoder output, then MLP."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_eps: float = 1e-6,
        norm_first: bool = True,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = MultiHeadAttention(
            dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop
        )
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.cross_attn = MultiHeadAttention(
            dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop, cross=True
        )
        self.norm3 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)
        self.drop_path = DropPath(drop_path)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        memory_padding_mask: Tensor | None = None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
    ) -> Tensor:
        """Update target tokens ``x`` (B, T, C) given the encoder output ``memory`` (B, S, C).

        With caches, ``x`` holds only the newest positions; earlier keys and values are reused.
        """

        def self_attn(h: Tensor) -> Tensor:
            return self.attn(h, is_causal=True, cache=self_cache)

        def cross_attn(h: Tensor) -> Tensor:
            return self.cross_attn(
                h, memory, key_padding_mask=memory_padding_mask, cache=cross_cache
            )

        if self.norm_first:
            x = x + self.drop_path(self_attn(self.norm1(x)))
            x = x + self.drop_path(cross_attn(self.norm2(x)))
            x = x + self.drop_path(self.mlp(self.norm3(x)))
        else:
            x = self.norm1(x + self.drop_path(self_attn(x)))
            x = self.norm2(x + self.drop_path(cross_attn(x)))
            x = self.norm3(x + self.drop_path(self.mlp(x)))
        return x


__all__ = ["DecoderBlock", "DropPath", "EncoderBlock", "Mlp"]
