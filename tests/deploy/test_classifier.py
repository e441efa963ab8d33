"""The input card (`vit.deploy.classifier.ModelInput`): one owner of how an image is read for a model, for each
channel count, and the same card whichever engine holds it."""

from __future__ import annotations

import math

import pytest
import torch

import vit
from vit.deploy.classifier import CARD_KEYS, Classifier, ModelInput


def classifier(in_chans: int, crop_pct: float = 0.875) -> Classifier:
    model = vit.create_model("vit_digits_patch2_8", in_chans=in_chans, num_classes=3, depth=1)
    return Classifier(model, model_name="vit_digits_patch2_8", class_names=["a", "b", "c"], mean=[0.5] * in_chans,
                      std=[0.25] * in_chans, crop_pct=crop_pct, interpolation="bilinear")


@pytest.mark.parametrize(("in_chans", "mode"), [(1, "L"), (3, "RGB"), (2, "RGB")])
def test_the_image_mode_follows_the_channels(in_chans, mode):
    # 1 channel decodes grey; 3 (and any other count, which the transform then folds) decode RGB
    assert classifier(in_chans).image_mode == mode


@pytest.mark.parametrize("crop_pct", [0.875, 1.0, 0.5])
def test_the_eval_resize_is_the_crop_over_crop_pct(crop_pct):
    # timm resizes the short side to floor(img_size / crop_pct), then crops img_size; the decode scale needs a
    # bound of it, so the card rounds up
    model = classifier(3, crop_pct)
    assert model.eval_short_side() == math.ceil(8 / crop_pct)
    assert model.eval_short_side(1.0) == 8  # an explicit crop_pct wins over the card's


def test_the_transform_gives_the_models_input():
    from PIL import Image

    model = classifier(1)
    x = model.eval_transform()(Image.new("L", (20, 12), 191))
    assert x.shape == (1, 8, 8)
    assert torch.allclose(x, torch.full_like(x, (191 / 255 - 0.5) / 0.25), atol=1e-6)


def test_the_card_round_trips_through_plain_values():
    model = classifier(3)
    card = model.card()
    assert sorted(card) == sorted(CARD_KEYS)
    other = ModelInput()
    other.set_card({k: v for k, v in card.items()})
    assert other.card() == card
    assert (other.image_mode, other.eval_short_side(), other.mean) == ("RGB", 10, (0.5, 0.5, 0.5))
