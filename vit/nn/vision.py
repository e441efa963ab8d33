"""The Vision Transformer (Dosovitskiy et al., 2021), with timm's state-dict names.

image (B, 3, 224, 224)
  -> PatchEmbed: Conv2d(k=s=16)            (B, 196, C)
  -> prepend cls token, add pos_embed      (B, 197, C)
  -> EncoderBlock x depth (pre-norm)       (B, 197, C)
  -> LayerNorm, cls token -> Linear head   (B, num_classes)

Two options from "Vision Transformer for Small-Size Datasets" (Lee, Lee & Song, 2021), both off by
default (off, the weights keep timm's names and the numerics timm's):
  shifted_patches=True     ShiftedPatchEmbed: image + 4 diagonal half-patch shifts (B, 5*3, 224, 224)
                           -> 16x16 patches, LayerNorm, Linear    (B, 196, C)
  locality_attention=True  every block's attention masks each token's own key and learns a
                           per-head temperature (`attn.learned_scale`)
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vit.errors import UserValueError
from vit.nn.blocks import EncoderBlock

# Named configurations; `create_model(name, **overrides)` builds them.
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "vit_tiny_patch16_224": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "vit_small_patch16_224": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_224": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
    "vit_base_patch32_224": dict(patch_size=32, embed_dim=768, depth=12, num_heads=12),
    "vit_large_patch16_224": dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16),
    "vit_small_patch16_384": dict(img_size=384, patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_384": dict(img_size=384, patch_size=16, embed_dim=768, depth=12, num_heads=12),
    # 32x32 CIFAR, after "Vision Transformer for Small-Size Datasets" (Lee et al., 2021).
    "vit_cifar_patch4_32": dict(
        img_size=32, patch_size=4, num_classes=10, embed_dim=192, depth=9, num_heads=12, mlp_ratio=2.0
    ),
    # From scratch on a small folder of your own (configs/scratch_small.yaml, scripts/parity.py): 16 patches.
    "vit_scratch_patch8_32": dict(img_size=32, patch_size=8, embed_dim=96, depth=4, num_heads=4),
    # scikit-learn's 8x8 grayscale digits: 16 patches of 2x2 ...
    "vit_digits_patch2_8": dict(
        img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=64, depth=4, num_heads=4,
        mlp_ratio=2.0,
    ),
    # ... or upsampled to 16x16: still 16 patches, each 4x4 (configs/digits.yaml).
    "vit_digits_patch4_16": dict(
        img_size=16, patch_size=4, in_chans=1, num_classes=10, embed_dim=64, depth=4, num_heads=4,
        mlp_ratio=2.0,
    ),
}


def _pair(x: int | Sequence[int]) -> tuple[int, int]:
    return (x, x) if isinstance(x, int) else (int(x[0]), int(x[1]))


def resample_pos_embed(
    pos_embed: Tensor, new_grid: tuple[int, int], old_grid: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
) -> Tensor:
    """Resize a (1, prefix + H*W, C) position embedding to a new patch grid.

    Bicubic with antialiasing, computed in fp32 (as timm does); prefix tokens are kept.
    """
    num_grid = pos_embed.shape[1] - num_prefix_tokens
    if old_grid is None:
        side = math.isqrt(num_grid)
        if side * side != num_grid:
            raise ValueError(
                f"cannot infer a square grid from {num_grid} position tokens; pass old_grid"
            )
        old_grid = (side, side)
    if tuple(old_grid) == tuple(new_grid):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    C = grid.shape[-1]
    grid = grid.float().reshape(1, *old_grid, C).permute(0, 3, 1, 2)  # (1, C, h, w)
    grid = F.interpolate(grid, size=new_grid, mode="bicubic", antialias=True, align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, C).to(pos_embed.dtype)  # (1, H*W, C)
    return torch.cat([prefix, grid], dim=1)


def patch_grid(
    height: int, width: int, img_size: tuple[int, int], patch_size: tuple[int, int], dynamic_img_size: bool
) -> tuple[int, int]:
    """The patch grid for an input of this size, or a clear error if the model does not accept it."""
    ph, pw = patch_size
    if dynamic_img_size:
        if height % ph or width % pw:
            raise ValueError(f"input {height}x{width} is not divisible by the patch size {ph}x{pw}")
    elif (height, width) != tuple(img_size):
        raise ValueError(
            f"expected a {img_size[0]}x{img_size[1]} input, got {height}x{width}; "
            "resize it, or build the model with dynamic_img_size=True"
        )
    return height // ph, width // pw


@torch.fx.wrap  # a leaf for torch.fx: it branches on the input's shape, which a symbolic trace does not know
def positions_for(
    x: Tensor, pos_embed: Tensor, img_size: tuple[int, int], patch_size: tuple[int, int], dynamic_img_size: bool
) -> Tensor:
    """``pos_embed`` for the images ``x`` (B, C, H, W): their size checked, resampled to their patch grid."""
    if x.dim() != 4:
        raise ValueError(f"expected images shaped (batch, channels, height, width), got {tuple(x.shape)}")
    grid = patch_grid(x.shape[-2], x.shape[-1], img_size, patch_size, dynamic_img_size)
    trained = (img_size[0] // patch_size[0], img_size[1] // patch_size[1])
    return pos_embed if grid == trained else resample_pos_embed(pos_embed, grid, trained)


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

    def __init__(self, img_size: int | Sequence[int], patch_size: int, in_chans: int, embed_dim: int):
        super().__init__(img_size, patch_size, in_chans)
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, C, h, w) -> (B, h*w, C)


class ShiftedPatchEmbed(PatchGrid):
    """Shifted Patch Tokenization: the image and four diagonal half-patch shifts, patched, normed, projected.

    As in the authors' code (aanna0701/SPT_LSA_ViT): zero-pad by s = patch // 2 on every side, crop the
    padded image at its top-left, top-right, bottom-left and bottom-right corners (contents moved by
    (+s, +s), (+s, -s), (-s, +s), (-s, -s) in (down, right)), put them after the image along channels,
    and flatten each patch row by row, channels fastest. Weights: ``norm`` then ``proj`` (a Linear).
    """

    def __init__(self, img_size: int | Sequence[int], patch_size: int, in_chans: int, embed_dim: int):
        super().__init__(img_size, patch_size, in_chans)
        ph, pw = self.patch_size
        self.shift = (ph // 2, pw // 2)
        patch_dim = 5 * in_chans * ph * pw
        self.norm = nn.LayerNorm(patch_dim, eps=1e-6)
        self.proj = nn.Linear(patch_dim, embed_dim)

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


class VisionTransformer(nn.Module):
    """ViT with a cls token, learned position embeddings and pre-norm encoder blocks.

    ``shifted_patches`` and ``locality_attention`` switch on SPT and LSA (see the module docstring).
    """

    num_prefix_tokens = 1  # the cls token

    def __init__(
        self,
        *,
        img_size: int | Sequence[int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        global_pool: str = "token",
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        dynamic_img_size: bool = False,
        shifted_patches: bool = False,
        locality_attention: bool = False,
    ) -> None:
        super().__init__()
        if global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool must be 'token' or 'avg', got {global_pool!r}")
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.embed_dim = self.num_features = embed_dim
        self.dynamic_img_size = dynamic_img_size
        self.shifted_patches = shifted_patches
        self.locality_attention = locality_attention
        self.grad_checkpointing = False

        embed = ShiftedPatchEmbed if shifted_patches else PatchEmbed
        self.patch_embed = embed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, embed_dim))
        self.pos_drop = nn.Dropout(pos_drop_rate)

        # Stochastic depth rises linearly from 0 to drop_path_rate (plain floats: works on the meta device).
        drop_path = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.Sequential(*[
            EncoderBlock(
                embed_dim, num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop_rate=drop_rate,
                attn_drop_rate=attn_drop_rate, drop_path_rate=drop_path[i], locality_attention=locality_attention,
            )
            for i in range(depth)
        ])
        # timm's convention: average pooling normalises after pooling, in `fc_norm`.
        use_fc_norm = global_pool == "avg"
        self.norm = nn.Identity() if use_fc_norm else nn.LayerNorm(embed_dim, eps=1e-6)
        self.fc_norm = nn.LayerNorm(embed_dim, eps=1e-6) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights()

    def init_weights(self) -> None:
        """timm's default ('jax'-free) initialisation."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    @property
    def img_size(self) -> tuple[int, int]:
        return self.patch_embed.img_size

    @property
    def patch_size(self) -> tuple[int, int]:
        return self.patch_embed.patch_size

    @property
    def in_chans(self) -> int:
        return self.patch_embed.in_chans

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token"}

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head (e.g. for fine-tuning on another label set)."""
        if global_pool is not None and global_pool != self.global_pool:
            raise ValueError("changing global_pool would change the norm layers; build a new model")
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        if num_classes > 0:
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    def patch_grid(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid for an input of this size, or a clear error if it is not accepted."""
        return patch_grid(height, width, self.img_size, self.patch_size, self.dynamic_img_size)

    def embed(self, x: Tensor) -> Tensor:
        """Image (B, C, H, W) -> tokens (B, 1 + h*w, D) with positions added."""
        pos_embed = positions_for(x, self.pos_embed, self.img_size, self.patch_size, self.dynamic_img_size)
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + pos_embed
        return self.pos_drop(x)

    def layer_indices(self, layers: int | Sequence[int] | None) -> list[int]:
        """Sorted block indices: the last n (an int), the listed ones (negative counts from the end), or all (None)."""
        depth = len(self.blocks)
        if layers is None:
            return list(range(depth))
        if isinstance(layers, int):
            if not 0 < layers <= depth:
                raise UserValueError(f"cannot take the last {layers} layers: the model has {depth} (1..{depth})")
            return list(range(depth - layers, depth))
        for i in layers:
            if not -depth <= i < depth:
                raise UserValueError(f"layer {i} does not exist: the model has {depth} layers (0..{depth - 1})")
        return sorted({i % depth for i in layers})

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them (timm's name).

        Only the block inputs are kept (B, N, D each): a big ViT trains at a fraction of the memory, for
        about one more forward pass of compute. Non-reentrant ``torch.utils.checkpoint``: same gradients.
        """
        self.grad_checkpointing = enable

    def forward_blocks(
        self,
        x: Tensor,
        *,
        attention_layers: Collection[int] = (),
        on_attention: Callable[[int, Tensor], None] | None = None,
        on_block: Callable[[int, Tensor], None] | None = None,
        stop_after: int | None = None,
        pooled_only: bool = False,
    ) -> Tensor:
        """Run the encoder blocks and the final norm over tokens (B, N, D): the one block loop.

        Blocks in ``attention_layers`` take the kernel's explicit path and hand their weights
        (B, heads, N, N) to ``on_attention(layer, weights)`` as soon as they exist. ``on_block(i, tokens)``
        sees every block's output; ``stop_after=i`` runs blocks 0..i only. With ``pooled_only`` a
        cls-token model's last block computes only the cls row, all the head needs.
        """
        last = len(self.blocks) - 1
        blocks = self.blocks if stop_after is None else self.blocks[:stop_after + 1]
        for i, block in enumerate(blocks):
            num_queries = 1 if pooled_only and i == last and self.global_pool == "token" else None
            if i in attention_layers:
                x, weights = block(x, num_queries=num_queries, return_attention=True)
                on_attention(i, weights)
            elif self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, num_queries=num_queries, use_reentrant=False)
            else:
                x = block(x, num_queries=num_queries)
            if on_block is not None:
                on_block(i, x)
        return self.norm(x)

    def forward_features(self, x: Tensor) -> Tensor:
        """All tokens after the final norm: (B, 1 + h*w, D)."""
        return self.forward_blocks(self.embed(x))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Pool the tokens (cls token or patch average) and classify."""
        x = x[:, 0] if self.global_pool == "token" else x[:, self.num_prefix_tokens:].mean(dim=1)
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_blocks(self.embed(x), pooled_only=True))

    def forward_attention(
        self, x: Tensor, layers: Sequence[int] | None = None
    ) -> tuple[Tensor, Tensor]:
        """Logits and the attention weights of the chosen layers (all by default).

        Weights come from the kernel's explicit path, stacked as
        (len(layers), B, heads, tokens, tokens). Keeping few layers keeps memory low.
        """
        weights: list[Tensor] = []
        tokens = self.forward_blocks(
            self.embed(x), attention_layers=self.layer_indices(layers),
            on_attention=lambda _, w: weights.append(w),
        )
        return self.forward_head(tokens), torch.stack(weights)

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[Any] | tuple[Tensor, list[Any]]:
        """Block outputs for dense tasks, with timm's signature and results.

        ``indices``: the last n blocks (an int), the listed ones (negative counts from the end), or all.
        Each output loses its prefix (cls) token, or comes as (spatial, prefix (B, 1, D)) pairs with
        ``return_prefix_tokens``; ``norm`` applies the final norm to each; ``output_fmt`` "NCHW" gives
        maps (B, D, h, w) on the input's own patch grid, "NLC" tokens (B, h*w, D). Returns the list, or
        (all tokens after the final norm, the list); ``stop_early`` stops at the last block asked for.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take = self.layer_indices(indices)
        h, w = self.patch_grid(x.shape[-2], x.shape[-1])
        taken: list[Tensor] = []

        def keep(i: int, tokens: Tensor) -> None:
            if i in take:
                taken.append(self.norm(tokens) if norm else tokens)

        final = self.forward_blocks(self.embed(x), on_block=keep, stop_after=take[-1] if stop_early else None)
        p = self.num_prefix_tokens
        prefixes, maps = [t[:, :p] for t in taken], [t[:, p:] for t in taken]
        if output_fmt == "NCHW":  # (B, h*w, D) -> (B, D, h, w)
            maps = [t.reshape(t.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous() for t in maps]
        out = list(zip(maps, prefixes)) if return_prefix_tokens else maps
        return out if intermediates_only else (final, out)

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks after the last of ``indices`` (and the final norm, the head); returns the indices kept.

        As timm's; after ``prune_head`` the model returns its pooled features instead of logits.
        """
        take = self.layer_indices(indices)
        self.blocks = self.blocks[:take[-1] + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm, self.head, self.num_classes = nn.Identity(), nn.Identity(), 0
        return take


def list_models() -> list[str]:
    """Names accepted by `create_model`."""
    return sorted(MODEL_CONFIGS)


def create_model(name: str, **overrides: Any) -> VisionTransformer:
    """Build a named configuration, e.g. ``create_model("vit_small_patch16_224", num_classes=10)``."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    accepted = inspect.signature(VisionTransformer).parameters
    unknown = sorted(set(overrides) - set(accepted))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for {name}; accepted: {', '.join(accepted)}"
        )
    return VisionTransformer(**{**MODEL_CONFIGS[name], **overrides})
