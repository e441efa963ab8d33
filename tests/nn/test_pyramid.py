"""ViTDet's simple feature pyramid over our ViT: levels, strides, and torchvision's detector taking it."""

import pytest
import timm
import torch
import torch.nn.functional as F

from tests.helpers import TINY_DIM
from tests.nn.test_vision import perturb
from vit.nn.pyramid import SimpleFeaturePyramid
from vit.nn.vision import VisionTransformer

SMALL = dict(img_size=64, patch_size=16, embed_dim=TINY_DIM, depth=2, num_heads=4, dynamic_img_size=True)


def test_levels_come_from_the_last_block_map():
    backbone = VisionTransformer(**SMALL)
    pyramid = perturb(SimpleFeaturePyramid(backbone, out_channels=24)).eval()
    theirs = timm.models.vision_transformer.VisionTransformer(**SMALL).eval()
    missing, unexpected = theirs.load_state_dict(backbone.state_dict(), strict=False)
    assert sorted(missing) == ["head.bias", "head.weight", "norm.bias", "norm.weight"] and not unexpected
    assert pyramid.strides == {"p2": 4, "p3": 8, "p4": 16, "p5": 32} and pyramid.out_channels == 24
    assert backbone.head.__class__ is torch.nn.Identity and len(backbone.blocks) == 2
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        out = pyramid(x)
        (last,) = theirs.forward_intermediates(x, indices=1, intermediates_only=True)  # (2, 32, 4, 6), no norm
        p3_in = pyramid.levels["p3"][0](last)
        want = {"p2": pyramid.levels["p2"][0](last), "p3": p3_in, "p4": last, "p5": F.max_pool2d(last, 2)}
        for name, level in pyramid.levels.items():
            torch.testing.assert_close(out[name], level[1:](want[name]), atol=1e-5, rtol=0)
    assert list(out) == ["p2", "p3", "p4", "p5"]
    assert [tuple(t.shape) for t in out.values()] == [(2, 24, 16, 24), (2, 24, 8, 12), (2, 24, 4, 6), (2, 24, 2, 3)]
    assert p3_in.shape == (2, 16, 8, 12) and pyramid.levels["p2"][0](last).shape == (2, 8, 16, 24)  # D/2, D/4


def test_torchvision_faster_rcnn_trains_on_it():
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign

    pyramid = SimpleFeaturePyramid(VisionTransformer(**SMALL), out_channels=16)
    detector = FasterRCNN(
        pyramid, num_classes=3, min_size=64, max_size=64,
        rpn_anchor_generator=AnchorGenerator(((8,), (16,), (32,), (64,)), ((0.5, 1.0, 2.0),) * 4),
        box_roi_pool=MultiScaleRoIAlign(list(pyramid.strides), output_size=7, sampling_ratio=2),
    )
    targets = [{"boxes": torch.tensor([[4.0, 8.0, 40.0, 50.0]]), "labels": torch.tensor([1])}]
    losses = detector([torch.rand(3, 64, 64)], targets)
    sum(losses.values()).backward()
    assert pyramid.backbone.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_patch_not_a_multiple_of_4_is_a_clear_error():
    with pytest.raises(ValueError, match="multiple of 4"):
        SimpleFeaturePyramid(VisionTransformer(**{**SMALL, "patch_size": 2, "img_size": 8}))
