"""The patch layers (`vit.nn.layers`): shifted patch tokens against a hand computation, and the shift directions on
one pixel."""

from __future__ import annotations
import numpy as np
import pytest
import timm
import torch
import vit
from tests.helpers import tiny_vit
from vit.deploy import load_classifier
from vit.errors import UserValueError
from vit.explain import collect_attention
from vit.nn.attention import MultiHeadAttention
from vit.nn.vision import PatchEmbed, ShiftedPatchEmbed
from vit.tasks.optim import param_groups


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
