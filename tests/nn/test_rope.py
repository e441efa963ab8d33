"""DINOv3's rotary positions (`vit.nn.rope`) against the formula in its docstring, written out per patch and
channel: centred coordinates, periods temperature^(2k / (head_dim/2)), y's frequencies then x's, each used twice."""

from __future__ import annotations

import math

import pytest
import torch

from vit.nn.rope import DinoV3Rope, Rotary


def test_the_angles_are_the_formula_per_patch_and_channel_and_the_prefix_is_not_turned():
    head_dim, h, w, prefix, temperature = 8, 2, 3, 1, 100.0
    rope = DinoV3Rope(head_dim, temperature=temperature, num_prefix_tokens=prefix)
    rotary = rope((h, w))
    assert rotary.sin.shape == rotary.cos.shape == (prefix + h * w, head_dim)
    assert torch.equal(rotary.sin[:prefix], torch.zeros(prefix, head_dim))
    assert torch.equal(rotary.cos[:prefix], torch.ones(prefix, head_dim))
    quarter = head_dim // 4
    for i in range(h):
        for j in range(w):
            y, x = 2 * (i + 0.5) / h - 1, 2 * (j + 0.5) / w - 1
            angles = [2 * math.pi * coord / temperature ** (2 * k / (head_dim / 2))
                      for coord in (y, x) for k in range(quarter)]  # head_dim/2 of them
            expected = torch.tensor(angles * 2)  # the "rotate half" layout: each angle for c and c + head_dim/2
            row = prefix + i * w + j
            torch.testing.assert_close(rotary.sin[row], expected.sin(), atol=1e-6, rtol=0)
            torch.testing.assert_close(rotary.cos[row], expected.cos(), atol=1e-6, rtol=0)


def test_a_rotation_turns_channel_pairs_and_keeps_lengths():
    g = torch.Generator().manual_seed(0)
    angles = torch.rand(5, 2, generator=g) * 6.3  # 5 tokens, head_dim 4: pairs (0, 2) and (1, 3)
    rotary = Rotary(torch.cat([angles.sin()] * 2, -1), torch.cat([angles.cos()] * 2, -1))
    x = torch.randn(1, 1, 5, 4, generator=g)
    turned = rotary.apply(x)
    z = torch.complex(x[..., :2], x[..., 2:]) * torch.polar(torch.ones_like(angles), angles)  # by hand
    torch.testing.assert_close(turned, torch.cat([z.real, z.imag], -1))
    torch.testing.assert_close(turned.norm(dim=-1), x.norm(dim=-1))
    assert rotary.apply(x[:, :, :2]).shape == (1, 1, 2, 4)  # fewer queries than tokens: the first rows


def test_the_periods_stay_fp32_in_half_precision_and_a_bad_head_dim_is_refused():
    rope = DinoV3Rope(8).half()
    assert rope.periods.dtype == torch.float32
    with pytest.raises(ValueError, match="head_dim divisible by 4, got 6"):
        DinoV3Rope(6)
