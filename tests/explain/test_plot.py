"""Drawing maps: upsampling, overlays, the layers x heads figure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vit
from tests.helpers import TINY_DIM
from vit.explain import collect_attention, to_display_image
from vit.explain.plot import overlay, plot_attention, upsample_map


def test_upsample_and_overlay_fit_the_image():
    heat = torch.zeros(4, 4)
    heat[1, 2] = 1.0
    up = upsample_map(heat, (32, 32))
    assert up.shape == (32, 32)
    assert divmod(int(up.argmax()), 32)[0] // 8 == 1 and divmod(int(up.argmax()), 32)[1] // 8 == 2
    image = to_display_image(torch.rand(1, 32, 32))
    assert image.shape == (32, 32, 3)
    blended = overlay(image, heat, alpha=0.4)
    assert blended.shape == (32, 32, 3) and blended.min() >= 0.0 and blended.max() <= 1.0
    with pytest.raises(ValueError, match="RGB"):
        to_display_image(np.zeros((4, 4, 2)))


def test_plot_attention_draws_layers_by_heads_plus_rollout():
    model = vit.create_model("vit_digits_patch2_8", embed_dim=TINY_DIM, depth=2, num_heads=4, num_classes=5).eval()
    images = torch.randn(1, 1, 8, 8)
    maps = collect_attention(model, images)
    fig = plot_attention(
        to_display_image(images[0], mean=[0.5], std=[0.5]), maps.cls_maps()[:, 0],
        layers=maps.layers, rollout=maps.rollout()[0], title="digit",
    )
    image_axes = [ax for ax in fig.get_axes() if ax.get_images()]
    assert len(image_axes) == 2 * 4 + 2  # layers x heads, the input, the rollout overlay
