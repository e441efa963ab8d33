"""The key converters (`vit.checkpoints.convert`): timm's own names pass through untouched. (Each family's converted
weights against timm: tests/checkpoints/test_weights.py and tests/nn/test_families.py.)"""

import timm

from vit.checkpoints.convert import to_timm_names


def test_to_timm_names_keeps_timm_state_dicts_unchanged():
    """A timm VisionTransformer's own names pass through untouched (no converter claims them)."""
    sd = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, depth=1, img_size=56).state_dict()
    assert list(to_timm_names(sd)) == list(sd)
