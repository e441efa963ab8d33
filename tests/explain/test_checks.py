"""Faithfulness checks: deletion/insertion curves on a model with a known answer, rank correlation against
scipy, cascading randomisation, the pointing game's synthetic set and score."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import spearmanr
from torch import nn

from tests.helpers import TINY_DIM, tiny_vit
from vit.explain.checks import (
    MAPS,
    area_under,
    cascading_randomisation,
    perturbation_curves,
    pointing_game,
    pointing_set,
    spearman,
)
from vit.nn.vision import VisionTransformer


class OnePatchModel(nn.Module):
    """Class 0's logit is 4 x the sum of patch (0, 0)'s pixels: only that patch matters."""

    patch_size = (2, 2)

    def forward(self, x):
        evidence = 4.0 * x[:, 0, :2, :2].sum(dim=(1, 2))
        return torch.stack([evidence, torch.zeros_like(evidence)], dim=1)


def test_deletion_and_insertion_curves_follow_the_one_patch_that_matters():
    images = torch.zeros(3, 1, 4, 4)
    images[:, :, :2, :2] = 1.0  # patch (0, 0) lit: class 0 with p = sigmoid(16)
    heat = torch.tensor([[4.0, 3.0], [2.0, 1.0]]).expand(3, 2, 2)  # ranks patch (0, 0) first
    target = torch.zeros(3, dtype=torch.long)
    curves = perturbation_curves(OnePatchModel(), images, heat, target)
    # Deleted patches take the image mean (0.25): patch (0, 0) then sums to 1 -> p = sigmoid(4).
    lit, gone = torch.sigmoid(torch.tensor(16.0)), torch.sigmoid(torch.tensor(4.0))
    torch.testing.assert_close(curves["MoRF deletion"], torch.stack([lit, gone, gone, gone, gone]))
    torch.testing.assert_close(curves["LeRF deletion"], torch.stack([lit, lit, lit, lit, gone]))
    torch.testing.assert_close(curves["insertion"], torch.stack([gone, lit, lit, lit, lit]))
    # With one fill for both, deleting the k least relevant leaves what inserting the n-k most relevant adds.
    assert torch.equal(curves["LeRF deletion"], curves["insertion"].flip(0))
    assert len(curves["random deletion"]) == 5
    assert area_under(curves["MoRF deletion"]) < area_under(curves["random deletion"]) < area_under(
        curves["LeRF deletion"])
    assert area_under(torch.tensor([0.0, 1.0, 1.0])) == pytest.approx(0.75)  # trapezoids over [0, 1]


def test_rank_correlation_matches_scipy():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 16, generator=g), torch.randn(5, 16, generator=g)
    expected = [spearmanr(a[i], b[i]).statistic for i in range(5)]
    torch.testing.assert_close(spearman(a, b), torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=0)
    assert spearman(a, a).allclose(torch.ones(5)) and spearman(a, -a).allclose(-torch.ones(5))




def test_cascading_randomisation_leaves_attention_alone_until_the_blocks_change():
    model = tiny_vit(num_classes=4)
    images = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = cascading_randomisation(model, images)
    assert result["steps"] == ["head", "head + blocks 1..1", "head + blocks 0..1"]
    # The head does not touch the attention, so the attention maps are the same; the gradient map is not.
    assert result["cls attention"][0] == pytest.approx(1.0) and result["rollout"][0] == pytest.approx(1.0)
    assert result["grad rollout"][0] < 0.99
    assert result["cls attention"][1] < 0.9  # the last block's own attention is now random
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()), "the model itself is untouched"
    assert set(MAPS) <= set(result)


def test_cascading_randomisation_goes_from_the_top_block_down():
    # A map that records the model it is shown: the first call is the trained model, then one per step. With
    # 3 blocks, step 1 re-initialises block 2 alone and step 2 blocks 1 and 2; block 0 waits for step 3.
    torch.manual_seed(0)
    model = VisionTransformer(img_size=8, patch_size=2, in_chans=1, num_classes=4, embed_dim=TINY_DIM, depth=3,
                              num_heads=2).eval()
    shown: list[list[dict[str, torch.Tensor]]] = []

    def recording(m, images):
        shown.append([{k: v.clone() for k, v in block.state_dict().items()} for block in m.blocks])
        return torch.rand(len(images), 4, 4)

    cascading_randomisation(model, torch.randn(2, 1, 8, 8), {"recording": recording})
    trained, steps = shown[0], shown[1:]
    changed = [[b for b in range(3) if any(not torch.equal(v, trained[b][k]) for k, v in step[b].items())]
               for step in steps]
    assert changed == [[], [2], [1, 2], [0, 1, 2]], changed


class Recorder(nn.Module):
    """A model of 2x2 patches that records every batch it is shown and answers two equal logits."""

    patch_size = (2, 2)

    def __init__(self) -> None:
        super().__init__()
        self.shown: list[torch.Tensor] = []

    def forward(self, x):
        self.shown.append(x.clone())
        return torch.zeros(len(x), 2)


def test_a_deleted_patch_takes_each_channels_own_mean():
    # Three channels around means 1, 0 and 0.5 (a +-0.2 checkerboard on each): once every patch is deleted, or
    # before any is inserted, the model sees those three means, not one grey value for all.
    r, c = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    wiggle = ((r + c) % 2 * 0.4 - 0.2)  # +-0.2, mean 0
    images = torch.stack([1.0 + wiggle, 0.0 + wiggle, 0.5 + wiggle])[None]  # (1, 3, 8, 8)
    model = Recorder()
    curves = perturbation_curves(model, images, torch.rand(1, 4, 4), torch.tensor([0]), random_orders=1)
    shown = model.shown
    assert len(shown) == 5 * 17 and len(curves["MoRF deletion"]) == 17
    means = torch.tensor([1.0, 0.0, 0.5]).view(1, 3, 1, 1).expand(1, 3, 8, 8)
    torch.testing.assert_close(shown[16], means, atol=1e-6, rtol=0)  # MoRF deletion, all 16 patches gone
    torch.testing.assert_close(shown[2 * 17], means, atol=1e-6, rtol=0)  # insertion, none yet
    torch.testing.assert_close(shown[0], images, atol=0, rtol=0)  # MoRF deletion, none gone yet


def test_pointing_set_hides_the_class_pattern_in_one_patch():
    images, labels, cells = pointing_set(64, noise=0.0, seed=3)
    assert images.shape == (64, 1, 16, 16) and set(labels.tolist()) == {0, 1, 2, 3}
    for i in range(64):
        r, c = divmod(int(cells[i]), 4)
        block = images[i, 0, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4]
        rest = images[i, 0].clone()
        rest[4 * r : 4 * r + 4, 4 * c : 4 * c + 4] = 0
        assert block.abs().min() == 1.0 and rest.abs().max() == 0  # +-1 pattern, no noise elsewhere here
    heat = torch.zeros(64, 4, 4)
    heat.view(64, 16)[torch.arange(64), cells] = 1.0
    assert pointing_game(heat, cells) == 1.0
    assert pointing_game(heat.roll(1, dims=2), cells) == 0.0
