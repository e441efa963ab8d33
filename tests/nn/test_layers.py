"""The patch layers (`vit.nn.layers`): shifted patch tokens against a hand computation, and the shift directions on
one pixel."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.nn.test_small_data import perturb
from vit.nn.layers import ShiftedPatchEmbed


def hand_spt(x: np.ndarray, P: int, norm_w, norm_b, eps: float, W, b) -> np.ndarray:
    """SPT by loops: (B, C, H, W) -> (B, h*w, D). Group g holds the pixel at (i + di, j + dj), zero outside."""
    B, C, H, Wd = x.shape
    s = P // 2
    # the image, then the padded image's top-left, top-right, bottom-left, bottom-right crops
    offsets = [(0, 0), (-s, -s), (-s, s), (s, -s), (s, s)]
    stacked = np.zeros((B, 5 * C, H, Wd))
    for g, (di, dj) in enumerate(offsets):
        for i in range(H):
            for j in range(Wd):
                if 0 <= i + di < H and 0 <= j + dj < Wd:
                    stacked[:, g * C:(g + 1) * C, i, j] = x[:, :, i + di, j + dj]
    tokens = []
    for r in range(H // P):  # patches row by row; inside a patch row by row, channels fastest
        for q in range(Wd // P):
            vec = [stacked[:, ch, r * P + pi, q * P + pj] for pi in range(P) for pj in range(P) for ch in range(5 * C)]
            vec = np.stack(vec, axis=-1)  # (B, P*P*5C)
            mean, var = vec.mean(-1, keepdims=True), vec.var(-1, keepdims=True)
            vec = (vec - mean) / np.sqrt(var + eps) * norm_w + norm_b
            tokens.append(vec @ W.T + b)
    return np.stack(tokens, axis=1)


@pytest.mark.parametrize("in_chans, patch", [(3, 4), (2, 3)])
def test_shifted_patch_tokens_match_a_hand_computation(in_chans, patch):
    embed = perturb(ShiftedPatchEmbed(12, patch, in_chans, 8)).double()
    x = torch.randn(2, in_chans, 12, 12, dtype=torch.float64)
    expected = hand_spt(x.numpy(), patch, embed.norm.weight.detach().numpy(), embed.norm.bias.detach().numpy(),
                        embed.norm.eps, embed.proj.weight.detach().numpy(), embed.proj.bias.detach().numpy())
    assert embed(x).shape == (2, (12 // patch) ** 2, 8)
    np.testing.assert_allclose(embed(x).detach().numpy(), expected, rtol=1e-10, atol=1e-10)


def test_shift_directions_on_a_single_pixel():
    """A pixel at (5, 6), patch 4 (s = 2), shows up at (7, 8), (7, 4), (3, 8), (3, 4) in groups 1..4."""
    embed = ShiftedPatchEmbed(12, 4, 1, 8)
    x = torch.zeros(1, 1, 12, 12)
    x[0, 0, 5, 6] = 1.0
    shifted = embed.shifted(x)[0]  # (5, 12, 12)
    where = [tuple(torch.nonzero(shifted[g]).flatten().tolist()) for g in range(5)]
    assert where == [(5, 6), (7, 8), (7, 4), (3, 8), (3, 4)]
    x[0, 0, 0, 0] = 1.0  # a corner pixel falls off in three of the four shifts: zero fill, no wrap-around
    assert embed.shifted(x)[:, 1:].sum() == 4 + 1


# ---- Shifted Patch Tokenization ------------------------------------------------------------------
