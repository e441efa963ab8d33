"""The Vision Transformer (Dosovitskiy et al., 2021), with timm's state-dict names, for every family in
`vit.nn.configs` (the classic ViT, DINOv2/v3, CLIP, SigLIP, DeiT III, DeiT distilled, MAE encoders).

image (B, 3, 224, 224)
  -> PatchEmbed: Conv2d(k=s=16)                     (B, 196, C)
  -> + pos_embed (patch rows), prepend prefix       (B, P + 196, C)   P = cls + dist + registers
     (prefix rows of pos_embed added to the prefix, unless no_embed_class), norm_pre (CLIP)
  -> EncoderBlock x depth (pre-norm, LayerScale)    (B, P + 196, C)   DINOv3: rotary q/k in every block
  -> norm, pool (cls / patch mean / attention pool / cls + mean), fc_norm, Linear head    (B, num_classes)

Two options from "Vision Transformer for Small-Size Datasets" (Lee, Lee & Song, 2021), both off by
default (off, the weights keep timm's names and the numerics timm's):
  shifted_patches=True     ShiftedPatchEmbed: image + 4 diagonal half-patch shifts (B, 5*3, 224, 224)
                           -> 16x16 patches, LayerNorm, Linear    (B, 196, C)
  locality_attention=True  every block's attention masks each token's own key and learns a
                           per-head temperature (`attn.learned_scale`)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vit.errors import UserValueError
from vit.nn.blocks import ACTIVATIONS, EncoderBlock
from vit.nn.configs import MODEL_CONFIGS, ViTConfig, list_models, named_config
from vit.nn.layers import AttentionPool, EmbeddingProjection, PatchEmbed, ShiftedPatchEmbed
from vit.nn.roles import ParamRoles
from vit.nn.rope import DinoV3Rope

__all__ = [
    "MODEL_CONFIGS", "DistilledVisionTransformer", "PatchEmbed", "ShiftedPatchEmbed", "ViTConfig",
    "VisionTransformer", "build_model", "create_model", "list_models", "positions_for", "resample_pos_embed",
]


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
    x: Tensor, pos_embed: Tensor | None, img_size: tuple[int, int], patch_size: tuple[int, int],
    dynamic_img_size: bool, num_prefix_tokens: int = 1,
) -> Tensor | None:
    """``pos_embed`` for the images ``x`` (B, C, H, W): their size checked, resampled to their patch grid.

    ``num_prefix_tokens``: the rows of ``pos_embed`` that are not patches (0 for a ``no_embed_class`` model)."""
    if x.dim() != 4:
        raise ValueError(f"expected images shaped (batch, channels, height, width), got {tuple(x.shape)}")
    grid = patch_grid(x.shape[-2], x.shape[-1], img_size, patch_size, dynamic_img_size)
    trained = (img_size[0] // patch_size[0], img_size[1] // patch_size[1])
    if pos_embed is None or grid == trained:
        return pos_embed
    return resample_pos_embed(pos_embed, grid, trained, num_prefix_tokens)


class VisionTransformer(nn.Module):
    """ViT with prefix tokens (cls, registers), learned or rotary positions and pre-norm encoder blocks.

    Built from one `ViTConfig` (``config=``, or its fields as keywords). The token layout is the model's:
    ``num_prefix_tokens`` tokens come first, then the h*w patches; `embed` joins them and `pool` reads them.
    """
    TOKENS = ("cls_token", "dist_token", "reg_token", "pos_embed")  # its learned tokens and positions (`param_roles`)

    def __init__(self, config: ViTConfig | None = None, **options: Any) -> None:
        super().__init__()
        c = self.config = (config or ViTConfig()).replace(**options)
        self.num_classes, self.global_pool = c.num_classes, c.global_pool
        self.embed_dim = self.num_features = c.embed_dim
        self.head_hidden_size = c.proj_dim or c.embed_dim * (2 if c.global_pool == "token_avg" else 1)  # head's input
        self.dynamic_img_size, self.no_embed_class = c.dynamic_img_size, c.no_embed_class
        self.shifted_patches, self.locality_attention = c.shifted_patches, c.locality_attention
        self.num_prefix_tokens = c.num_prefix_tokens
        self.grad_checkpointing = False

        embed = ShiftedPatchEmbed if c.shifted_patches else PatchEmbed
        self.patch_embed = embed(c.img_size, c.patch_size, c.in_chans, c.embed_dim, bias=not c.pre_norm)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim)) if c.class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, c.reg_tokens, c.embed_dim)) if c.reg_tokens else None
        self.pos_embed = None
        if c.pos_embed == "learn":  # no_embed_class: rows for the patches only
            rows = self.patch_embed.num_patches + (0 if c.no_embed_class else self.num_prefix_tokens)
            self.pos_embed = nn.Parameter(torch.zeros(1, rows, c.embed_dim))
        self.rope = None
        if c.rope == "dinov3":
            self.rope = DinoV3Rope(c.embed_dim // c.num_heads, c.rope_temperature, self.num_prefix_tokens)
        self.pos_drop = nn.Dropout(c.pos_drop_rate)
        self.norm_pre = nn.LayerNorm(c.embed_dim, eps=c.norm_eps) if c.pre_norm else nn.Identity()

        # Stochastic depth rises linearly from 0 to drop_path_rate (plain floats: works on the meta device).
        drop_path = [c.drop_path_rate * i / max(c.depth - 1, 1) for i in range(c.depth)]
        self.blocks = nn.Sequential(*[EncoderBlock.from_config(c, drop_path_rate=rate) for rate in drop_path])
        # timm's convention: average pooling normalises after pooling, in `fc_norm`; SigLIP pools by attention.
        layer_norm = lambda: nn.LayerNorm(c.embed_dim, eps=c.norm_eps)
        self.norm = layer_norm() if c.final_norm and not c.use_fc_norm else nn.Identity()
        self.attn_pool = (AttentionPool(c.embed_dim, c.num_heads, mlp_ratio=c.mlp_ratio, norm_eps=c.norm_eps,
                                        act_layer=ACTIVATIONS[c.act_layer]) if c.global_pool == "map" else None)
        self.fc_norm = layer_norm() if c.final_norm and c.use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(c.drop_rate)
        self.proj = (EmbeddingProjection(c.embed_dim, c.proj_dim, normalize=c.normalize_embedding)
                     if c.proj_dim or c.normalize_embedding else nn.Identity())  # CLIP's joint space (vit.nn.clip)
        self.head = nn.Linear(self.head_hidden_size, c.num_classes) if c.num_classes > 0 else nn.Identity()
        self.init_weights()

    def init_weights(self) -> None:
        """timm's default ('jax'-free) initialisation."""
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for token in self.prefix_tokens():
            nn.init.normal_(token, std=1e-6)
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

    @property
    def pos_embed_prefix(self) -> int:
        """How many rows of ``pos_embed`` belong to prefix tokens: 0 with ``no_embed_class``."""
        return 0 if self.no_embed_class else self.num_prefix_tokens

    def param_roles(self) -> ParamRoles:
        """Which parameters play which role (`vit.nn.roles`): optimiser, layer decay, fine-tuning, MAE ask it."""
        tokens = tuple(t for t in self.TOKENS if getattr(self, t, None) is not None)
        blocks = tuple((f"blocks.{i}",) for i in range(len(self.blocks)))
        return ParamRoles(stem=("patch_embed", "norm_pre"), tokens=tokens, blocks=blocks,
                          pool=("norm", "attn_pool", "fc_norm", "proj"), head=("head", "head_dist"), no_decay=tokens)

    def no_weight_decay(self) -> set[str]:
        return set(self.TOKENS)  # timm's set: every token's name, whether this model has it or not

    def get_classifier(self) -> nn.Module:
        return self.head

    def _new_head(self, num_classes: int) -> nn.Module:
        if num_classes <= 0:
            return nn.Identity()
        head = nn.Linear(self.head_hidden_size, num_classes)
        nn.init.trunc_normal_(head.weight, std=0.02)
        nn.init.zeros_(head.bias)
        return head.to(self.patch_embed.proj.weight.device)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head (e.g. for fine-tuning on another label set)."""
        if global_pool is not None and global_pool != self.global_pool:
            raise ValueError("changing global_pool would change the norm layers; build a new model")
        self.num_classes = num_classes
        self.config = self.config.replace(num_classes=num_classes)  # the description stays the model's
        self.head = self._new_head(num_classes)

    def patch_grid(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid for an input of this size, or a clear error if it is not accepted."""
        return patch_grid(height, width, self.img_size, self.patch_size, self.dynamic_img_size)

    # --- the token layout -------------------------------------------------------------------
    def prefix_tokens(self) -> list[Tensor]:
        """The learned tokens before the patches, in order: cls, then registers (each (1, n, D))."""
        return [t for t in (self.cls_token, self.reg_token) if t is not None]

    def embed_patches(self, x: Tensor) -> Tensor:
        """Images (B, C, H, W) -> patch tokens (B, h*w, D), each with its position added (if any)."""
        pos = positions_for(x, self.pos_embed, self.img_size, self.patch_size, self.dynamic_img_size,
                            self.pos_embed_prefix)
        x = self.patch_embed(x)
        return x if pos is None else x + pos[:, self.pos_embed_prefix:]

    def join_prefix(self, patches: Tensor) -> Tensor:
        """Patch tokens (B, n, D) -> (B, prefix + n, D): prefix tokens (with their own positions) put first."""
        B = patches.shape[0]
        prefix = torch.cat([t.expand(B, -1, -1) for t in self.prefix_tokens()], dim=1) if self.num_prefix_tokens \
            else patches[:, :0]
        if self.pos_embed is not None and self.pos_embed_prefix:
            prefix = prefix + self.pos_embed[:, :self.pos_embed_prefix]
        return self.norm_pre(self.pos_drop(torch.cat([prefix, patches], dim=1)))

    def embed(self, x: Tensor) -> Tensor:
        """Image (B, C, H, W) -> tokens (B, prefix + h*w, D), positions added: the one embedding step."""
        return self.join_prefix(self.embed_patches(x))

    def pool(self, x: Tensor) -> Tensor:
        """Tokens (B, N, D) -> (B, D): the cls token, the patch mean, or SigLIP's attention pool; (B, 2D): both."""
        if self.global_pool == "token":
            return x[:, 0]
        patches = x[:, self.num_prefix_tokens:]
        if self.global_pool == "token_avg":
            return torch.cat([x[:, 0], patches.mean(dim=1)], dim=-1)
        return patches.mean(dim=1) if self.global_pool == "avg" else self.attn_pool(patches)

    @property
    def pooled_rows(self) -> int | None:
        """How many leading tokens the head reads (the last block computes only those), or None for all."""
        return 1 if self.global_pool == "token" else None

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
        grid: tuple[int, int] | None = None,
        attention_layers: Collection[int] = (),
        on_attention: Callable[[int, Tensor], None] | None = None,
        on_block: Callable[[int, Tensor], None] | None = None,
        stop_after: int | None = None,
        pooled_only: bool = False,
    ) -> Tensor:
        """Run the encoder blocks and the final norm over tokens (B, N, D): the one block loop.

        ``grid``: the patch grid (h, w), which rotary positions need. Blocks in ``attention_layers`` take the
        kernel's explicit path and hand their weights (B, heads, N, N) to ``on_attention(layer, weights)`` as
        soon as they exist. ``on_block(i, tokens)`` sees every block's output; ``stop_after=i`` runs blocks
        0..i only. With ``pooled_only`` the last block computes only the rows the head reads (`pooled_rows`).
        """
        rope = None
        if self.rope is not None:
            if grid is None:
                raise ValueError("a model with rotary positions needs the patch grid: forward_blocks(x, grid=(h, w))")
            rope = self.rope(grid)
        last = len(self.blocks) - 1
        blocks = self.blocks if stop_after is None else self.blocks[:stop_after + 1]
        for i, block in enumerate(blocks):
            num_queries = self.pooled_rows if pooled_only and i == last else None
            if i in attention_layers:
                x, weights = block(x, num_queries=num_queries, return_attention=True, rope=rope)
                on_attention(i, weights)
            elif self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, num_queries=num_queries, rope=rope, use_reentrant=False)
            else:
                x = block(x, num_queries=num_queries, rope=rope)
            if on_block is not None:
                on_block(i, x)
        return self.norm(x)

    def tokens(self, x: Tensor, **kwargs: Any) -> Tensor:
        """Images (B, C, H, W) through the embedding and `forward_blocks` (its keyword arguments)."""
        # The grid only for rotary positions: a torch.fx trace of the others never branches on the input's shape.
        grid = self.patch_grid(x.shape[-2], x.shape[-1]) if self.rope is not None else None
        return self.forward_blocks(self.embed(x), grid=grid, **kwargs)

    def forward_features(self, x: Tensor) -> Tensor:
        """All tokens after the final norm: (B, prefix + h*w, D)."""
        return self.tokens(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Pool the tokens and classify."""
        x = self.proj(self.head_drop(self.fc_norm(self.pool(x))))
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.tokens(x, pooled_only=True))

    def forward_attention(
        self, x: Tensor, layers: Sequence[int] | None = None
    ) -> tuple[Tensor, Tensor]:
        """Logits and the attention weights of the chosen layers (all by default).

        Weights come from the kernel's explicit path, stacked as
        (len(layers), B, heads, tokens, tokens). Keeping few layers keeps memory low.
        """
        weights: list[Tensor] = []
        tokens = self.tokens(x, attention_layers=self.layer_indices(layers),
                             on_attention=lambda _, w: weights.append(w))
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
        Each output loses its prefix tokens, or comes as (spatial, prefix (B, prefix, D)) pairs with
        ``return_prefix_tokens`` (when the model has any); ``norm`` applies the final norm to each;
        ``output_fmt`` "NCHW" gives maps (B, D, h, w) on the input's own patch grid, "NLC" tokens (B, h*w, D).
        Returns the list, or (all tokens after the final norm, the list); ``stop_early`` stops at the last
        block asked for.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take = self.layer_indices(indices)
        h, w = self.patch_grid(x.shape[-2], x.shape[-1])
        taken: list[Tensor] = []

        def keep(i: int, tokens: Tensor) -> None:
            if i in take:
                taken.append(self.norm(tokens) if norm else tokens)

        final = self.tokens(x, on_block=keep, stop_after=take[-1] if stop_early else None)
        p = self.num_prefix_tokens
        prefixes, maps = [t[:, :p] for t in taken], [t[:, p:] for t in taken]
        if output_fmt == "NCHW":  # (B, h*w, D) -> (B, D, h, w)
            maps = [t.reshape(t.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous() for t in maps]
        out = list(zip(maps, prefixes)) if return_prefix_tokens and p else maps
        return out if intermediates_only else (final, out)

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks after the last of ``indices`` (and the final norm, the head); returns the indices kept.

        As timm's; after ``prune_head`` the model returns its pooled features instead of logits.
        """
        take = self.layer_indices(indices)
        self.blocks = self.blocks[:take[-1] + 1]
        self.config = self.config.replace(depth=len(self.blocks))
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm, self.num_classes = nn.Identity(), 0
            self.reset_classifier(0)
        return take


class DistilledVisionTransformer(VisionTransformer):
    """DeiT's distilled ViT (Touvron et al., 2021): a ``dist_token`` after the cls token, and ``head_dist`` on it.

    In eval (and unless ``distilled_training`` is on) the logits are the mean of the two heads, as timm's.
    """

    def __init__(self, config: ViTConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        self.dist_token = nn.Parameter(torch.zeros(1, 1, self.embed_dim))
        nn.init.trunc_normal_(self.dist_token, std=0.02)
        self.head_dist = self._new_head(self.num_classes)
        self.distilled_training = False  # True: training returns (cls logits, dist logits) for a distillation loss

    def prefix_tokens(self) -> list[Tensor]:
        return [t for t in (self.cls_token, getattr(self, "dist_token", None), self.reg_token) if t is not None]

    @property
    def pooled_rows(self) -> int:
        return 2  # both heads' tokens come out of the last block

    def get_classifier(self) -> tuple[nn.Module, nn.Module]:  # type: ignore[override]
        return self.head, self.head_dist

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        super().reset_classifier(num_classes, global_pool)
        self.head_dist = self._new_head(num_classes)

    def pool(self, x: Tensor) -> Tensor:
        return (x[:, 0] + x[:, 1]) / 2  # what `pre_logits` returns: the mean of the two tokens

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:  # type: ignore[override]
        if pre_logits:
            return self.pool(x)
        cls, dist = self.head(self.head_drop(x[:, 0])), self.head_dist(self.head_drop(x[:, 1]))
        if self.distilled_training and self.training:
            return cls, dist
        return (cls + dist) / 2


def build_model(config: ViTConfig | dict[str, Any]) -> VisionTransformer:
    """The model a config describes (a checkpoint's ``model_config`` dict, or a `ViTConfig`)."""
    config = config if isinstance(config, ViTConfig) else ViTConfig.from_dict(config)
    return (DistilledVisionTransformer if config.distilled else VisionTransformer)(config)


def create_model(name: str, **overrides: Any) -> VisionTransformer:
    """Build a named configuration, e.g. ``create_model("vit_small_patch14_dinov2", num_classes=10)``."""
    return build_model(named_config(name, **overrides))
