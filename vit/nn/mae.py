"""Masked-autoencoder pre-training (He et al., 2021, "Masked Autoencoders Are Scalable Vision Learners")
around the unchanged `VisionTransformer`.

    image (B, C, H, W)
      -> encoder.patch_embed, + pos_embed (no cls yet)       (B, N, D)
      -> random_masking: keep n = round(N (1 - mask_ratio))   (B, n, D)    a new draw for every image
      -> prepend the prefix (cls, + its position), blocks, norm (B, 1 + n, D)
    MAEDecoder
      -> embed                                                (B, 1 + n, d)
      -> append N - n mask tokens, unshuffle to patch order   (B, 1 + N, d)
      -> + fixed 2-D sin-cos positions, blocks, norm, pred    (B, 1 + N, d) -> drop cls -> (B, N, ph*pw*C)
    loss: squared error against `patchify(image)` (with ``norm_pix_loss`` each target patch normalised by
    its own mean and variance), averaged over the masked patches only

The encoder sees only the visible patches (a quarter at the default ratio), which is what makes MAE cheap;
the decoder, which sees all N, is narrow and shallow. The encoder is a plain `VisionTransformer` used
through its public parts, so its state dict is a classifier's: `vit fit --model.init_args.pretrained` and
`vit probe` load it with every key checked, and the decoder is left behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from vit.nn.blocks import EncoderBlock
from vit.nn.roles import ParamRoles, roles_of
from vit.nn.vision import VisionTransformer


# ---- patches -----------------------------------------------------------------------------------------
def patchify(images: Tensor, patch_size: Sequence[int]) -> Tensor:
    """(B, C, H, W) -> (B, h*w, ph*pw*C): patches row by row, each flattened row, column, channel (MAE's order)."""
    B, C, H, W = images.shape
    ph, pw = patch_size
    x = images.reshape(B, C, H // ph, ph, W // pw, pw).permute(0, 2, 4, 3, 5, 1)  # (B, h, w, ph, pw, C)
    return x.reshape(B, (H // ph) * (W // pw), ph * pw * C)


def unpatchify(patches: Tensor, patch_size: Sequence[int], grid: Sequence[int]) -> Tensor:
    """The inverse of `patchify`: (B, h*w, ph*pw*C) -> (B, C, h*ph, w*pw)."""
    (ph, pw), (h, w) = patch_size, grid
    B, C = patches.shape[0], patches.shape[-1] // (ph * pw)
    x = patches.reshape(B, h, w, ph, pw, C).permute(0, 5, 1, 3, 2, 4)  # (B, C, h, ph, w, pw)
    return x.reshape(B, C, h * ph, w * pw)


def normalize_patches(patches: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor, Tensor]:
    """``norm_pix_loss``'s targets: each patch minus its mean, over sqrt(its unbiased variance + eps); also
    the means and standard deviations (B, N, 1), which turn a prediction back into pixels."""
    mean = patches.mean(dim=-1, keepdim=True)
    std = (patches.var(dim=-1, keepdim=True) + eps).sqrt()
    return (patches - mean) / std, mean, std


def reconstruction_loss(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Mean squared error per patch (B, N), averaged over the patches where ``mask`` is 1 (the masked ones)."""
    per_patch = (pred.float() - target.float()).pow(2).mean(dim=-1)
    return (per_patch * mask).sum() / mask.sum()


# ---- masking -----------------------------------------------------------------------------------------
class Masking(NamedTuple):
    """One random masking of a batch: ``keep`` (B, n) the visible patches' indices, in the encoder's order;
    ``restore`` (B, N) the permutation that puts [visible, masked] tokens back in patch order; ``mask``
    (B, N) 1 where a patch is masked, in patch order."""

    keep: Tensor
    restore: Tensor
    mask: Tensor


def num_visible(num_patches: int, mask_ratio: float) -> int:
    """How many patches of ``num_patches`` each image shows the encoder: round(N (1 - mask_ratio))."""
    return round(num_patches * (1.0 - mask_ratio))


def random_masking(
    batch: int, num_patches: int, visible: int, *, device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> Masking:
    """A fresh random choice of ``visible`` patches per image: the patches with the lowest of N uniform draws.

    Draws come from ``generator`` (made on its own device, then moved), else torch's global generator on
    ``device``, so a seed reproduces them."""
    where = generator.device if generator is not None else device
    noise = torch.rand(batch, num_patches, generator=generator, device=where).to(device)
    shuffle = noise.argsort(dim=1)  # ascending: the first `visible` are kept
    restore = shuffle.argsort(dim=1)  # patch i sits at restore[i] in [kept, masked]
    mask = (restore >= visible).float()
    return Masking(shuffle[:, :visible], restore, mask)


def take_tokens(x: Tensor, index: Tensor) -> Tensor:
    """Rows ``index`` (B, n) of tokens ``x`` (B, N, D) -> (B, n, D)."""
    return torch.gather(x, 1, index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


# ---- positions -----------------------------------------------------------------------------------------
def sincos_pos_embed(dim: int, grid: Sequence[int], num_prefix_tokens: int = 1) -> Tensor:
    """Fixed 2-D sine-cosine positions (1, prefix + h*w, dim), prefix tokens at zero, as MAE's.

    The first half of the channels encodes the column, the second the row, each as [sin, cos] of the
    coordinate times the frequencies 1 / 10000^(k / (dim/4)), k = 0..dim/4 - 1."""
    if dim % 4:
        raise ValueError(f"sin-cos positions need a width divisible by 4, got {dim}")
    h, w = grid
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    rows, cols = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64),
                                indexing="ij")

    def axis(coord: Tensor) -> Tensor:  # (h*w,) -> (h*w, dim/2)
        angles = coord.reshape(-1, 1) * omega
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    grid_embed = torch.cat([axis(cols), axis(rows)], dim=1)  # (h*w, dim)
    prefix = torch.zeros(num_prefix_tokens, dim, dtype=torch.float64)
    return torch.cat([prefix, grid_embed]).unsqueeze(0).float()


# ---- the encoder on the visible patches -----------------------------------------------------------------
def encode_visible(
    encoder: VisionTransformer, images: Tensor, visible: int, *, generator: torch.Generator | None = None
) -> tuple[Tensor, Masking]:
    """The encoder on ``visible`` random patches of each image: its tokens (B, P + n, D) after the final norm
    (``norm``, or ``fc_norm`` for an average-pooling model, whose ``norm`` is the identity), and the masking.

    The encoder's own embedding steps: patch tokens with their positions, masked, then its prefix tokens
    (P = ``encoder.num_prefix_tokens``) put first."""
    if encoder.rope is not None:
        raise ValueError("MAE masks patches before the blocks; rotary positions (DINOv3) would need the kept "
                         "patches' coordinates: use a model with learned positions")
    x = encoder.embed_patches(images)  # (B, N, D): positions go with their patches
    B, N, _ = x.shape
    masking = random_masking(B, N, visible, device=x.device, generator=generator)
    x = encoder.join_prefix(take_tokens(x, masking.keep))  # (B, P + n, D)
    return encoder.fc_norm(encoder.forward_blocks(x)), masking


# ---- the decoder --------------------------------------------------------------------------------------
class MAEDecoder(nn.Module):
    """MAE's light decoder: encoder tokens and mask tokens, in patch order, to pixel values per patch."""

    def __init__(
        self, *, embed_dim: int, grid_size: Sequence[int], patch_size: Sequence[int], in_chans: int,
        decoder_dim: int = 512, decoder_depth: int = 8, decoder_heads: int = 16, mlp_ratio: float = 4.0,
    ) -> None:
        super().__init__()
        if decoder_dim % decoder_heads:
            raise ValueError(f"decoder_dim {decoder_dim} is not divisible by decoder_heads {decoder_heads}")
        self.grid_size = tuple(grid_size)
        self.embed = nn.Linear(embed_dim, decoder_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
        # Fixed, so not saved: rebuilt from the grid (a non-persistent buffer follows the module's device).
        self.register_buffer("pos_embed", sincos_pos_embed(decoder_dim, self.grid_size), persistent=False)
        self.blocks = nn.Sequential(*[EncoderBlock(decoder_dim, decoder_heads, mlp_ratio=mlp_ratio)
                                      for _ in range(decoder_depth)])
        self.norm = nn.LayerNorm(decoder_dim, eps=1e-6)
        self.pred = nn.Linear(decoder_dim, patch_size[0] * patch_size[1] * in_chans)

    def param_roles(self) -> ParamRoles:
        """Its blocks, and the mask token AdamW must not decay (`vit.nn.roles`); the positions are a fixed buffer."""
        return ParamRoles(blocks=tuple((f"blocks.{i}",) for i in range(len(self.blocks))), tokens=("mask_token",),
                          no_decay=("mask_token",))

    def forward(
        self, latent: Tensor, restore: Tensor, grid: Sequence[int] | None = None, num_prefix_tokens: int = 1
    ) -> Tensor:
        """Encoder tokens (B, P + n, D), P = ``num_prefix_tokens``, and `Masking.restore` (B, N) -> predicted
        patches (B, N, ph*pw*C). The decoder keeps one prefix token: the encoder's first (its cls token)."""
        x = self.embed(latent)  # (B, P + n, d)
        B, N = restore.shape
        p = num_prefix_tokens
        masked = self.mask_token.to(x.dtype).expand(B, N + p - x.shape[1], -1)
        patches = take_tokens(torch.cat([x[:, p:], masked], dim=1), restore)  # (B, N, d) in patch order
        grid = self.grid_size if grid is None else tuple(grid)
        pos_embed = self.pos_embed if grid == self.grid_size else sincos_pos_embed(x.shape[-1], grid).to(x.device)
        first = x[:, :1] if p else x.new_zeros(B, 1, x.shape[-1])  # no prefix at all: a zero token in its place
        x = torch.cat([first, patches], dim=1) + pos_embed
        return self.pred(self.norm(self.blocks(x)))[:, 1:]


def mae_init_(module: VisionTransformer | MAEDecoder) -> None:
    """MAE's initialisation: Xavier-uniform linear layers (and the patch projection, as one), zero biases, and
    the learned tokens (the module's ``tokens`` role: cls, registers, the decoder's mask token) from N(0, 0.02);
    positions are left to the caller (`sincos_pos_embed`)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Conv2d):  # a patch projection: a linear map of the flattened patch
            nn.init.xavier_uniform_(m.weight.view(m.weight.shape[0], -1))
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    parameters = dict(module.named_parameters())
    for name in roles_of(module).tokens:
        if name != "pos_embed":
            nn.init.normal_(parameters[name], std=0.02)


__all__ = [
    "MAEDecoder", "Masking", "encode_visible", "mae_init_", "normalize_patches", "num_visible", "patchify",
    "random_masking", "reconstruction_loss", "sincos_pos_embed", "take_tokens", "unpatchify",
]
