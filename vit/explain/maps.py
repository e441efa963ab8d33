"""Attention maps of a Vision Transformer: per layer and head, attention rollout, and its gradient version.

Everything here reads the weights from the attention kernel's explicit path
(``return_attention=True``), never from hooks: the fused SDPA path computes no weights.

Shapes used throughout:
    weights   (L, B, H, N, N)   L layers, B images, H heads, N = prefix tokens + h*w patches
    maps      (L, B, H, h, w)   what the pooled query token attends to, on the patch grid
    rollout   (B, h, w)         attention rolled out through every layer (Abnar & Zuidema, 2020)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vit.nn.vision import VisionTransformer

HEAD_FUSIONS = ("mean", "max", "min")


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    # Dropout on the attention weights would make every map random: explain in eval mode,
    # then give the model back in the mode it came in.
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _check_images(model: VisionTransformer, images: Tensor) -> tuple[int, int]:
    """The patch grid for ``images``, or a clear error about what the model expected."""
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"expected a vit.VisionTransformer, got {type(model).__name__}")
    if images.dim() != 4:
        raise ValueError(
            f"expected images shaped (batch, channels, height, width), got {tuple(images.shape)}"
        )
    in_chans = model.in_chans
    if images.shape[1] != in_chans:
        raise ValueError(f"the model takes {in_chans}-channel images, got {images.shape[1]} channels")
    return model.patch_grid(images.shape[-2], images.shape[-1])


def _query_rows(attn: Tensor, num_prefix_tokens: int, global_pool: str) -> Tensor:
    """Rows (..., N, N) -> what the pooled token attends to over the patches (..., h*w).

    A cls-token model reads the cls row (so does "token_avg", DINOv2's cls + patch mean: the cls row is the
    map DINOv2 shows). A model that averages its patch tokens never uses the cls token, so its map is the
    mean of the patch rows.
    """
    if global_pool in ("token", "token_avg"):
        return attn[..., 0, num_prefix_tokens:]
    return attn[..., num_prefix_tokens:, num_prefix_tokens:].mean(dim=-2)


def _to_grid(rows: Tensor, grid: tuple[int, int]) -> Tensor:
    if rows.shape[-1] != grid[0] * grid[1]:
        raise ValueError(f"{rows.shape[-1]} patch tokens do not fill a {grid[0]}x{grid[1]} grid")
    return rows.reshape(*rows.shape[:-1], *grid)  # (..., h*w) -> (..., h, w)


def cls_attention_maps(
    weights: Tensor, grid: tuple[int, int], num_prefix_tokens: int = 1, global_pool: str = "token"
) -> Tensor:
    """Cls-to-patch attention per layer and head: (L, B, H, N, N) -> (L, B, H, h, w).

    Prefix tokens (cls, registers) are dropped from the keys, so a map sums to less than 1
    by whatever the cls token gave to the prefix tokens.
    """
    if weights.dim() != 5:
        raise ValueError(f"expected weights shaped (layers, batch, heads, N, N), got {tuple(weights.shape)}")
    return _to_grid(_query_rows(weights, num_prefix_tokens, global_pool), grid)


def rollout_layer(weights: Tensor, head_fusion: str = "mean", discard_ratio: float = 0.0) -> Tensor:
    """One layer's row-stochastic attention with the residual: (B, H, N, N) -> (B, N, N).

    Heads are fused by mean, max or min; optionally the lowest ``discard_ratio`` of each row
    is zeroed (never the cls->cls entry). Each row is renormalised to sum to 1 and mixed
    half-and-half with the identity, which stands for the residual connection.
    """
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(
            f"expected one layer's weights shaped (batch, heads, N, N), got {tuple(weights.shape)}"
        )
    if head_fusion == "mean":
        attn = weights.mean(dim=1)  # (B, N, N)
    elif head_fusion == "max":
        attn = weights.amax(dim=1)
    else:
        attn = weights.amin(dim=1)
    return _discard_and_add_residual(attn.float(), discard_ratio)


def _discard_and_add_residual(attn: Tensor, discard_ratio: float) -> Tensor:
    """(B, N, N) non-negative scores -> row-stochastic (B, N, N), identity mixed in."""
    B, N, _ = attn.shape
    num_discard = int(N * discard_ratio)
    if num_discard > 0:
        # Rank each row's entries, cls->cls forced to the top so it is always kept.
        ranked = attn.clone()
        ranked[:, 0, 0] = float("inf")
        lowest = ranked.topk(num_discard, dim=-1, largest=False).indices  # (B, N, k)
        attn = attn.scatter(-1, lowest, 0.0)
    eye = torch.eye(N, dtype=attn.dtype, device=attn.device).expand(B, N, N)
    row_sums = attn.sum(dim=-1, keepdim=True)  # rows sum over keys: dim=-1, keepdim for broadcasting
    # A row with nothing left (possible for gradient-weighted scores) keeps only its residual.
    attn = torch.where(row_sums > 0, attn / row_sums.clamp_min(torch.finfo(attn.dtype).tiny), eye)
    return 0.5 * attn + 0.5 * eye


def rollout_matrix(layer_matrices: Sequence[Tensor] | Tensor) -> Tensor:
    """Multiply per-layer (B, N, N) matrices, first layer first: R = A_L @ ... @ A_1."""
    rollout = None
    for attn in layer_matrices:
        rollout = attn if rollout is None else attn @ rollout
    if rollout is None:
        raise ValueError("rollout needs at least one layer")
    return rollout


def rollout_map(
    rollout: Tensor, grid: tuple[int, int], num_prefix_tokens: int = 1, global_pool: str = "token"
) -> Tensor:
    """The pooled token's row of a (B, N, N) rollout over the patches, as a (B, h, w) grid."""
    return _to_grid(_query_rows(rollout, num_prefix_tokens, global_pool), grid)


def attention_rollout(
    weights: Tensor,
    grid: tuple[int, int],
    *,
    num_prefix_tokens: int = 1,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    global_pool: str = "token",
) -> Tensor:
    """Attention rollout from every layer's weights (L, B, H, N, N) -> (B, h, w)."""
    layers = [rollout_layer(w, head_fusion, discard_ratio) for w in weights]
    return rollout_map(rollout_matrix(layers), grid, num_prefix_tokens, global_pool)


@dataclass
class AttentionMaps:
    """One forward pass's logits and attention weights, with the model facts needed to map them."""

    logits: Tensor  # (B, classes)
    weights: Tensor  # (L, B, H, N, N), layers in `layers` order
    layers: list[int]  # which blocks the weights come from, in increasing order
    depth: int  # how many blocks the model has
    grid: tuple[int, int]  # patch grid (h, w) of these images
    num_prefix_tokens: int
    global_pool: str
    pool_weights: Tensor | None = None  # (B, H, h*w): SigLIP's attention-pool query over the patches

    def pool_map(self) -> Tensor:
        """What an attention-pool head (SigLIP's, ``global_pool="map"``) attends to, per head: (B, H, h, w).

        A model without a cls token has no cls row to read; its pooled feature is the pool's latent query
        attending to the last block's patches, so that query's own weights are its map (big_vision #145)."""
        if self.pool_weights is None:
            raise ValueError(f"this model pools by {self.global_pool!r}, not by an attention pool: use cls_maps()")
        return _to_grid(self.pool_weights, self.grid)

    def cls_maps(self) -> Tensor:
        """Cls-to-patch maps per collected layer and head: (L, B, H, h, w)."""
        return cls_attention_maps(self.weights, self.grid, self.num_prefix_tokens, self.global_pool)

    def rollout(self, head_fusion: str = "mean", discard_ratio: float = 0.0) -> Tensor:
        """Attention rollout through all layers: (B, h, w). Needs every layer's weights."""
        if self.layers != list(range(self.depth)):
            raise ValueError(
                f"rollout multiplies through all {self.depth} layers, but only layers {self.layers} "
                "were collected; call collect_attention with layers=None"
            )
        return attention_rollout(
            self.weights, self.grid, num_prefix_tokens=self.num_prefix_tokens,
            head_fusion=head_fusion, discard_ratio=discard_ratio, global_pool=self.global_pool,
        )

    def top_k(self, k: int = 5) -> tuple[Tensor, Tensor]:
        """Softmax probabilities and class indices of the k best classes, each (B, k)."""
        probs = self.logits.float().softmax(dim=-1)
        return probs.topk(min(k, probs.shape[-1]), dim=-1)


@torch.no_grad()
def collect_attention(
    model: VisionTransformer, images: Tensor, layers: Sequence[int] | None = None
) -> AttentionMaps:
    """Run one forward pass and keep the logits and the chosen layers' attention (all by default).

    Negative layer indices count from the end (``layers=[-1]``: the last layer only, which
    keeps memory low at high resolution). The model runs in eval mode.
    """
    grid = _check_images(model, images)
    chosen = model.layer_indices(layers)
    collected: list[Tensor] = []
    pool_weights = None
    with _eval_mode(model):
        tokens = model.tokens(images, attention_layers=chosen, on_attention=lambda _, w: collected.append(w))
        logits = model.forward_head(tokens)
        if model.attn_pool is not None:  # the attention pool's own weights: (B, H, 1, h*w) -> (B, H, h*w)
            pool_weights = model.attn_pool(tokens[:, model.num_prefix_tokens:], return_attention=True)[1][:, :, 0]
    return AttentionMaps(
        logits=logits, weights=torch.stack(collected), layers=chosen, depth=len(model.blocks), grid=grid,
        num_prefix_tokens=model.num_prefix_tokens, global_pool=model.global_pool, pool_weights=pool_weights,
    )


def _forward_layerwise(
    model: VisionTransformer, images: Tensor, on_weights: Callable[[Tensor], None]
) -> Tensor:
    """Logits, handing each block's weights (B, H, N, N) to ``on_weights`` as soon as they exist."""
    tokens = model.tokens(images, attention_layers=range(len(model.blocks)), on_attention=lambda _, w: on_weights(w))
    return model.forward_head(tokens)


@torch.no_grad()
def rollout_streaming(
    model: VisionTransformer, images: Tensor, *, head_fusion: str = "mean", discard_ratio: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Logits (B, classes) and attention rollout (B, h, w), folding in one layer at a time.

    Holds one (B, N, N) product instead of every layer's weights: use it at high resolution.
    """
    grid = _check_images(model, images)
    product: Tensor | None = None  # A_l @ ... @ A_1 so far, (B, N, N)

    def fold(weights: Tensor) -> None:
        nonlocal product
        layer = rollout_layer(weights, head_fusion, discard_ratio)
        product = layer if product is None else layer @ product

    with _eval_mode(model):
        logits = _forward_layerwise(model, images, fold)
    return logits, rollout_map(product, grid, model.num_prefix_tokens, model.global_pool)


def gradient_rollout(
    model: VisionTransformer,
    images: Tensor,
    target: int | Sequence[int] | Tensor | None = None,
    *,
    discard_ratio: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Rollout weighted toward a class: logits (B, classes) and a map (B, h, w).

    Each layer's attention is multiplied by the gradient of the target logit with respect
    to it, negative contributions are dropped, and heads are averaged before the usual
    residual, renormalisation and product. This is the rule of vit-explain's ``grad_rollout``
    (jacobgil/vit-explain), not Chefer et al. (2021b), whose relevance update is R += Ā·R.
    ``target`` is a class per image, one class for all, or None for the predicted class.
    """
    grid = _check_images(model, images)
    kept: list[Tensor] = []

    def keep(weights: Tensor) -> None:
        weights.retain_grad()
        kept.append(weights)

    with _eval_mode(model), torch.enable_grad():
        # Gradients must reach the weights even when the model's parameters are frozen.
        logits = _forward_layerwise(model, images.detach().requires_grad_(True), keep)
        B, num_classes = logits.shape
        if target is None:
            target = logits.argmax(dim=-1)
        target = torch.as_tensor(target, device=logits.device).long().flatten()
        if target.numel() not in (1, B):
            raise ValueError(f"target gives {target.numel()} classes for {B} images; give 1 or {B}")
        target = target.expand(B)
        if (target < 0).any() or (target >= num_classes).any():
            raise ValueError(f"target class out of range for {num_classes} classes: {target.tolist()}")
        logits.gather(1, target[:, None]).sum().backward()

    layers = []
    for weights in kept:
        relevance = (weights.grad * weights).clamp(min=0).mean(dim=1)  # (B, N, N)
        layers.append(_discard_and_add_residual(relevance.detach().float(), discard_ratio))
    heat = rollout_map(rollout_matrix(layers), grid, model.num_prefix_tokens, model.global_pool)
    return logits.detach(), heat


def mean_attention_distance(
    weights: Tensor, grid: tuple[int, int], num_prefix_tokens: int = 1, patch_size: int = 1
) -> Tensor:
    """Average distance between a patch and the patches it attends to: (L, B, H, N, N) -> (L, H).

    In pixels if ``patch_size`` is given (the "attention distance" of Dosovitskiy et al.,
    Fig. 7): small in heads that look locally, large in heads that look across the image.
    """
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    coords = torch.stack([rows.flatten(), cols.flatten()], dim=-1).float() * patch_size  # (h*w, 2)
    distance = torch.cdist(coords, coords).to(weights.device)  # (h*w, h*w)
    patches = weights[..., num_prefix_tokens:, num_prefix_tokens:].float()  # (L, B, H, h*w, h*w)
    # Weight each key's distance by its share of the attention the query gives to patches.
    patches = patches / patches.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    per_query = (patches * distance).sum(dim=-1)  # (L, B, H, h*w)
    return per_query.mean(dim=(1, 3))

