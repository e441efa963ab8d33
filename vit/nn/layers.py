"""Small parts: the patch embeddings and SigLIP's attention pool.

(LayerScale, QuickGELU and the activations by name, parts of every block, are in `vit.nn.blocks`.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit.nn.attention import MultiHeadAttention
from vit.nn.blocks import ACTIVATIONS, Mlp, QuickGELU  # noqa: F401 - the activations' old home


class AttentionPool(MultiHeadAttention):
    """SigLIP's attention-pool head (MAP, timm's ``AttentionPoolLatent``): one learned query attends to the patches.

    patches (B, N, D) -> latent query cross-attends (q, kv, proj) -> (B, 1, D) -> + mlp(norm(.)) -> (B, D)
    Weights: ``latent`` (1, 1, D), ``q``, ``kv``, ``proj`` (the cross-attention's), ``norm``, ``mlp``.
    """

    def __init__(
        self, embed_dim: int, num_heads: int, *, mlp_ratio: float = 4.0, norm_eps: float = 1e-6,
        act_layer: Callable[[], nn.Module] = nn.GELU,
    ) -> None:
        super().__init__(embed_dim, num_heads, cross=True)
        self.latent = nn.Parameter(torch.zeros(1, 1, embed_dim))
        nn.init.trunc_normal_(self.latent, std=embed_dim**-0.5)
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps)
        self.mlp = Mlp(embed_dim, int(embed_dim * mlp_ratio), act_layer=act_layer)

    def forward(self, x: Tensor, *, return_attention: bool = False) -> Tensor | tuple[Tensor, Tensor]:  # type: ignore[override]
        """Pool patch tokens (B, N, D) -> (B, D); with ``return_attention`` also the weights (B, heads, 1, N)."""
        out = super().forward(self.latent.expand(x.shape[0], -1, -1), x, return_attention=return_attention)
        out, weights = out if return_attention else (out, None)
        out = (out + self.mlp(self.norm(out)))[:, 0]
        return (out, weights) if return_attention else out


class EmbeddingProjection(nn.Module):
    """CLIP's image projection into the joint space (bias-free, ``weight`` (out, in); none: ``out_dim`` 0), then,
    with ``normalize``, unit length: (B, D) -> (B, out_dim or D)."""

    def __init__(self, in_dim: int, out_dim: int, *, normalize: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim)) if out_dim else None
        if self.weight is not None:
            nn.init.normal_(self.weight, std=in_dim**-0.5)
        self.normalize = normalize

    def forward(self, x: Tensor) -> Tensor:
        x = x if self.weight is None else F.linear(x, self.weight)
        return F.normalize(x, dim=-1) if self.normalize else x

    def extra_repr(self) -> str:
        return f"normalize={self.normalize}"


def _pair(x: int | Sequence[int]) -> tuple[int, int]:
    return (x, x) if isinstance(x, int) else (int(x[0]), int(x[1]))


class PatchGrid(nn.Module):
    """What every patch embedding knows: image and patch size, the patch grid, the input channels."""

    def __init__(self, img_size: int | Sequence[int], patch_size: int | Sequence[int], in_chans: int) -> None:
        super().__init__()
        self.img_size = _pair(img_size)
        self.patch_size = _pair(patch_size)
        for side, p in zip(self.img_size, self.patch_size):
            if side % p:
                raise ValueError(
                    f"img_size {self.img_size} is not divisible by patch_size {self.patch_size}"
                )
        self.grid_size = (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.in_chans = in_chans


class PatchEmbed(PatchGrid):
    """Split an image into non-overlapping patches and project each to ``embed_dim``."""

    def __init__(
        self, img_size: int | Sequence[int], patch_size: int, in_chans: int, embed_dim: int, bias: bool = True
    ) -> None:
        super().__init__(img_size, patch_size, in_chans)
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, C, h, w) -> (B, h*w, C)


class ShiftedPatchEmbed(PatchGrid):
    """Shifted Patch Tokenization: the image and four diagonal half-patch shifts, patched, normed, projected.

    As in the authors' code (aanna0701/SPT_LSA_ViT): zero-pad by s = patch // 2 on every side, crop the
    padded image at its top-left, top-right, bottom-left and bottom-right corners (contents moved by
    (+s, +s), (+s, -s), (-s, +s), (-s, -s) in (down, right)), put them after the image along channels,
    and flatten each patch row by row, channels fastest. Weights: ``norm`` then ``proj`` (a Linear).
    """

    def __init__(
        self, img_size: int | Sequence[int], patch_size: int, in_chans: int, embed_dim: int, bias: bool = True
    ) -> None:
        super().__init__(img_size, patch_size, in_chans)
        ph, pw = self.patch_size
        self.shift = (ph // 2, pw // 2)
        patch_dim = 5 * in_chans * ph * pw
        self.norm = nn.LayerNorm(patch_dim, eps=1e-6)
        self.proj = nn.Linear(patch_dim, embed_dim, bias=bias)

    def shifted(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, 5C, H, W): the image, then its four zero-filled diagonal shifts."""
        (sh, sw), (H, W) = self.shift, x.shape[-2:]
        padded = F.pad(x, (sw, sw, sh, sh))  # (B, C, H + 2sh, W + 2sw), zeros around
        crops = [padded[..., i:i + H, j:j + W] for i in (0, 2 * sh) for j in (0, 2 * sw)]
        return torch.cat([x, *crops], dim=1)

    def forward(self, x: Tensor) -> Tensor:
        x = self.shifted(x)
        B, C, H, W = x.shape
        ph, pw = self.patch_size
        x = x.reshape(B, C, H // ph, ph, W // pw, pw).permute(0, 2, 4, 3, 5, 1)  # (B, h, w, ph, pw, 5C)
        x = x.reshape(B, (H // ph) * (W // pw), ph * pw * C)  # (B, h*w, ph*pw*5C)
        return self.proj(self.norm(x))
