"""The export library (`vit.deploy.export`): timm architectures and arguments for every config, and each family's
safetensors and ONNX files against timm and PyTorch."""

from __future__ import annotations

import json

import pytest
import timm
import torch

import vit
from tests.helpers import TINY_DIM
from vit.checkpoints.convert import convert_layer_scale
from vit.deploy import export
from vit.nn.vision import MODEL_CONFIGS


def test_every_timm_named_config_maps_to_its_timm_architecture_unchanged():
    """Our configs with timm names build timm's models (same state-dict shapes), so no model_args are needed;
    the digits and CIFAR configs get the closest timm name plus the arguments that make the shapes match."""
    for name, config in MODEL_CONFIGS.items():
        with torch.device("meta"):
            ours = vit.create_model(name, num_classes=7)
        architecture, model_args = export.timm_architecture(name, ours)
        if timm.is_model(name):
            assert (architecture, model_args) == (name, {}), name
        else:
            assert architecture == "vit_tiny_patch16_224" and {"img_size", "patch_size", "depth"} <= set(model_args)
            assert vit.create_model(architecture, num_classes=7, **model_args).embed_dim == config["embed_dim"]
        with torch.device("meta"):
            theirs = timm.create_model(architecture, num_classes=7, **model_args)
        # timm's Eva (DINOv3) names its LayerScale gamma_1/2: the same tensors once renamed (vit.checkpoints.convert)
        assert {k: v.shape for k, v in convert_layer_scale(theirs.state_dict()).items()} == {
            k: v.shape for k, v in ours.state_dict().items()}, name


def test_every_config_field_is_exported_or_named_as_training_only():
    """A new ViTConfig option cannot drop silently out of the timm export: it is a timm argument, one timm lacks
    (refused), or one that shapes training only (dropout rates; num_classes travels on its own)."""
    import dataclasses

    from vit.nn.configs import ViTConfig

    training_only = {"num_classes", "drop_rate", "pos_drop_rate", "attn_drop_rate", "drop_path_rate"}
    fields = {f.name for f in dataclasses.fields(ViTConfig)}
    assert fields - training_only == set(export.TIMM_ARGS) | set(export.NOT_TIMM_ARGS)


def test_avg_pool_model_round_trips_through_timm(tmp_path):
    """A non-default option (average pooling, another patch size) travels in model_args and gives the same logits."""
    from vit.deploy.classifier import Classifier

    model = vit.create_model("vit_small_patch16_224", img_size=32, patch_size=8, depth=2, global_pool="avg",
                             num_classes=3).eval()
    classifier = Classifier(model, model_name="vit_small_patch16_224", class_names=["a", "b", "c"], mean=[0.5] * 3,
                            std=[0.5] * 3, crop_pct=0.9, interpolation="bicubic")
    export.export_safetensors(classifier, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_args"] == {"img_size": 32, "patch_size": 8, "depth": 2, "global_pool": "avg"}
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), model(x), atol=1e-5, rtol=0)


FAMILIES = ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2", "vit_small_patch16_dinov3",
            "vit_small_patch16_dinov3_qkvb", "vit_base_patch16_clip_224", "vit_base_patch16_clip_quickgelu_224",
            "vit_base_patch16_siglip_224", "vit_base_patch16_siglip_gap_224", "deit3_small_patch16_224",
            "deit_small_distilled_patch16_224"]


# Through ONNX too (each trace takes seconds): the families whose graphs differ in kind from the classic ViT's.
# Of the rest, LayerScale, norm_pre and average pooling are inside these graphs, and QuickGELU is x * sigmoid(1.702x).
ONNX_FAMILIES = {"vit_small_patch14_reg4_dinov2", "vit_small_patch16_dinov3", "vit_base_patch16_siglip_224",
                 "deit_small_distilled_patch16_224"}


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_round_trips_through_timm_and_onnx(name, tmp_path):
    """timm loads the exported safetensors strictly and gives our logits; the ONNX file agrees with PyTorch.
    Tiny widths: what is checked is each family's layout (tokens, pooling, LayerScale, norms, heads)."""
    from vit.deploy.classifier import Classifier

    p = MODEL_CONFIGS[name]["patch_size"]
    shape = {"img_size": 2 * p, "depth": 1, "embed_dim": TINY_DIM, "num_heads": 2}
    model = vit.create_model(name, **shape, num_classes=3).eval()
    classifier = Classifier(model, model_name=name, class_names=["a", "b", "c"], mean=[0.5] * 3, std=[0.5] * 3,
                            crop_pct=1.0, interpolation="bicubic")
    export.export_safetensors(classifier, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architecture"] == name and config["model_args"] == shape
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    from safetensors.torch import load_file

    theirs.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=True)
    x = torch.randn(2, 3, 2 * p, 2 * p)
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), model(x), atol=1e-5, rtol=0)
    if name in ONNX_FAMILIES:
        (check,) = export.export_onnx(classifier, tmp_path)
        assert check.max_abs_diff <= export.ONNX_TOLERANCE and check.top1_agreement == 1.0
