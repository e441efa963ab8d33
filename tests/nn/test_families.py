"""The modern families (DINOv2 with and without registers, DINOv3, CLIP, SigLIP, DeiT III, DeiT distilled, MAE)
against timm on the same random weights: every named size, built shallow and small so it runs on 2 cores.

Full-size, full-depth comparisons are `../shared/checks/V-backbones-exact`'s; the numerics do not depend on
depth (each block is the same code) and the widths, head counts and token layouts here are the real ones.
"""

import tempfile

import pytest
import timm
import torch
from safetensors.torch import save_file

import vit
from tests.helpers import TINY_DIM
from tests.nn.test_vision import perturb
from vit.nn.vision import MODEL_CONFIGS

FAMILIES = {
    "dinov2": ["vit_small_patch14_dinov2", "vit_base_patch14_dinov2", "vit_large_patch14_dinov2"],
    "dinov2_reg4": ["vit_small_patch14_reg4_dinov2", "vit_base_patch14_reg4_dinov2", "vit_large_patch14_reg4_dinov2"],
    "dinov3": ["vit_small_patch16_dinov3", "vit_base_patch16_dinov3", "vit_large_patch16_dinov3",
               "vit_small_patch16_dinov3_qkvb", "vit_base_patch16_dinov3_qkvb", "vit_large_patch16_dinov3_qkvb"],
    "clip": ["vit_base_patch16_clip_224", "vit_base_patch32_clip_224", "vit_large_patch14_clip_224",
             "vit_base_patch16_clip_quickgelu_224", "vit_base_patch32_clip_quickgelu_224"],
    "siglip": ["vit_base_patch16_siglip_224", "vit_base_patch16_siglip_256", "vit_base_patch16_siglip_gap_224"],
    "deit3": ["deit3_small_patch16_224", "deit3_base_patch16_224"],
    "deit_distilled": ["deit_tiny_distilled_patch16_224", "deit_small_distilled_patch16_224",
                       "deit_base_distilled_patch16_224"],
}
NAMES = [name for names in FAMILIES.values() for name in names]
FOLDER = tempfile.TemporaryDirectory()
PREFIX = {"dinov2": 1, "dinov2_reg4": 5, "dinov3": 5, "clip": 1, "siglip": 0, "deit3": 1, "deit_distilled": 2}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def small(name: str) -> dict:
    """Two blocks, a 4x4 patch grid: the family's own width, heads and token layout."""
    return dict(depth=2, img_size=4 * MODEL_CONFIGS[name]["patch_size"], num_classes=5)


def pair(name: str, **options) -> tuple[torch.nn.Module, torch.nn.Module]:
    """timm's model (perturbed weights) and ours, loaded from timm's state dict saved as a file."""
    theirs = perturb(timm.create_model(name, pretrained=False, **options)).eval()
    ours = vit.create_model(name, **options).eval()
    result = vit.load_pretrained(ours, saved(theirs))
    assert not result.head_reset and not result.notes, result.notes
    return theirs, ours


def saved(model: torch.nn.Module) -> str:
    """The model's state dict as a .safetensors file (in a folder removed at exit)."""
    path = f"{FOLDER.name}/{id(model)}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    return path


def flat(out) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [t for part in out for t in flat(part)]


@pytest.mark.parametrize("name", NAMES)
def test_every_family_and_size_equals_timm(name):
    """Logits, forward_features and forward_intermediates (prefix tokens too) within 1e-4 of timm's."""
    theirs, ours = pair(name, **small(name))
    family = next(f for f, names in FAMILIES.items() if name in names)
    assert ours.num_prefix_tokens == theirs.num_prefix_tokens == PREFIX[family]
    x = torch.randn(2, 3, *ours.img_size)
    with torch.no_grad():
        assert (ours(x) - theirs(x)).abs().max() <= 1e-4
        assert (ours.forward_features(x) - theirs.forward_features(x)).abs().max() <= 1e-4
        for kwargs in (dict(indices=[0, -1], return_prefix_tokens=True), dict(indices=1, norm=True, output_fmt="NLC")):
            want, got = flat(theirs.forward_intermediates(x, **kwargs)), flat(ours.forward_intermediates(x, **kwargs))
            assert [t.shape for t in got] == [t.shape for t in want]
            assert max((a - b).abs().max().item() for a, b in zip(got, want)) <= 1e-4


def test_a_fresh_models_layer_scale_starts_where_timms_does():
    # The parity test above overwrites LayerScale with timm's weights: here both are fresh. DeiT III starts its
    # gammas at 1e-6, DINOv2 and DINOv3 at 1e-5 (timm's Eva calls them gamma_1/gamma_2); the others have none.
    # The value is the family's (configs.py), so its smallest size stands for it: the large ones take seconds.
    for name in [names[0] for names in FAMILIES.values()]:
        options = dict(depth=1, img_size=4 * MODEL_CONFIGS[name]["patch_size"])
        theirs = {k.replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma"): v
                  for k, v in timm.create_model(name, pretrained=False, **options).state_dict().items()
                  if "gamma" in k}
        ours = {k: v for k, v in vit.create_model(name, **options).state_dict().items() if "gamma" in k}
        assert ours.keys() == theirs.keys(), (name, sorted(ours), sorted(theirs))
        for k in ours:
            torch.testing.assert_close(ours[k], theirs[k], rtol=0, atol=0, msg=f"{name} {k}")


@pytest.mark.parametrize("name", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2",
                                  "deit3_small_patch16_224", "deit_small_distilled_patch16_224",
                                  "vit_base_patch16_siglip_224"])
def test_pos_embed_resampled_with_the_models_prefix_count(name):
    """Weights at a 4x4 grid loaded into a 6x6 model: timm resamples them the same (its checkpoint filter);
    with no_embed_class the prefix count is 0, with registers 5, distilled 2, SigLIP 0."""
    p = MODEL_CONFIGS[name]["patch_size"]
    trained = perturb(timm.create_model(name, pretrained=False, depth=2, img_size=4 * p, num_classes=5))
    theirs = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=saved(trained)),
                               depth=2, img_size=6 * p, num_classes=5).eval()
    ours = vit.create_model(name, depth=2, img_size=6 * p, num_classes=5).eval()
    result = vit.load_pretrained(ours, saved(trained))
    assert result.pos_embed_resampled
    x = torch.randn(1, 3, 6 * p, 6 * p)
    with torch.no_grad():  # features: timm leaves a head fresh when its pretrained_cfg has another class count
        assert (ours.pos_embed - theirs.pos_embed).abs().max() <= 1e-5
        assert (ours.forward_features(x) - theirs.forward_features(x)).abs().max() <= 1e-4


@pytest.mark.parametrize("name", ["vit_small_patch14_reg4_dinov2", "deit_small_distilled_patch16_224",
                                  "vit_small_patch16_dinov3"])
def test_dynamic_img_size_follows_the_input(name):
    """Another input size at run time (pos_embed resampled with the prefix count, or the rotary grid rebuilt)."""
    p = MODEL_CONFIGS[name]["patch_size"]
    theirs, ours = pair(name, **small(name), dynamic_img_size=True)
    x = torch.randn(1, 3, 3 * p, 5 * p)
    with torch.no_grad():
        assert (ours(x) - theirs(x)).abs().max() <= 1e-4
        assert (ours.forward_features(x) - theirs.forward_features(x)).abs().max() <= 1e-4


def test_deit_distilled_heads_mean_in_eval_and_both_in_distilled_training():
    theirs, ours = pair("deit_tiny_distilled_patch16_224", **small("deit_tiny_distilled_patch16_224"))
    x = torch.randn(2, 3, 64, 64)
    tokens = ours.forward_features(x)
    with torch.no_grad():
        assert torch.allclose(ours(x), (ours.head(tokens[:, 0]) + ours.head_dist(tokens[:, 1])) / 2, atol=1e-6)
        assert torch.allclose(ours.forward_head(tokens, pre_logits=True), theirs.forward_head(tokens, pre_logits=True))
    ours.train().distilled_training = True
    theirs.train().set_distilled_training(True)
    cls, dist = ours(x)
    want = theirs(x)
    assert torch.allclose(cls, want[0], atol=1e-4) and torch.allclose(dist, want[1], atol=1e-4)


def test_mae_encoder_with_average_pooling_equals_timm():
    """timm's MAE weights (vit_base_patch16_224.mae: norm.*, no head) fine-tuned with global average pooling:
    MAE's rule drops norm.*, fc_norm starts fresh, logged; then the model computes what timm's avg model does."""
    mae = perturb(timm.create_model("vit_base_patch16_224", pretrained=False, depth=2, img_size=64, num_classes=0))
    ours = vit.create_model("vit_base_patch16_224", depth=2, img_size=64, num_classes=5, global_pool="avg").eval()
    result = vit.load_pretrained(ours, saved(mae))
    assert result.head_reset and any("fc_norm starts fresh" in note for note in result.notes)
    theirs = timm.create_model("vit_base_patch16_224", pretrained=False, depth=2, img_size=64, num_classes=5,
                               global_pool="avg").eval()
    theirs.load_state_dict({k: v for k, v in mae.state_dict().items() if not k.startswith("norm.")}, strict=False)
    theirs.head.load_state_dict(ours.head.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (ours(x) - theirs(x)).abs().max() <= 1e-4


@pytest.mark.parametrize("name", ["vit_small_patch16_dinov3", "vit_small_patch16_dinov3_qkvb"])
def test_dinov3_at_224_and_another_size(name):
    theirs, ours = pair(name, depth=2, num_classes=5)
    for size in ((224, 224), (160, 288)):
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            assert (ours(x) - theirs(x)).abs().max() <= 1e-4, size


def test_no_weight_decay_and_layer_decay_groups_follow_timm():
    for name in ("vit_small_patch14_reg4_dinov2", "deit_small_distilled_patch16_224", "vit_base_patch16_clip_224",
                 "vit_base_patch16_siglip_224"):
        theirs = timm.create_model(name, pretrained=False, **small(name))
        ours = vit.create_model(name, **small(name))
        assert ours.no_weight_decay() == theirs.no_weight_decay(), name
        stem = [n for n, _ in ours.named_parameters() if not n.startswith(("blocks.", "norm.", "fc_norm.", "head",
                                                                             "attn_pool."))]
        roles = ours.param_roles()
        assert stem and all(roles.layer(n) == 0 for n in stem), stem  # reg/dist tokens and norm_pre with the stem
        assert all(roles.layer(n) == 3 for n, _ in ours.named_parameters() if n.startswith("attn_pool."))


def test_the_config_is_the_one_description_and_rebuilds_the_model():
    """What a checkpoint stores (``config.to_dict()``) rebuilds the same class with the same state-dict layout."""
    from vit.nn.configs import ViTConfig
    from vit.nn.vision import DistilledVisionTransformer, build_model

    for name in ("deit_small_distilled_patch16_224", "vit_small_patch16_dinov3", "vit_base_patch16_siglip_224"):
        model = vit.create_model(name, **small(name))
        again = build_model(model.config.to_dict())
        assert type(again) is type(model) and again.config == model.config
        shapes = {k: v.shape for k, v in model.state_dict().items()}
        assert {k: v.shape for k, v in again.state_dict().items()} == shapes
    assert isinstance(build_model(ViTConfig(distilled=True, depth=1, embed_dim=TINY_DIM, num_heads=4)),
                      DistilledVisionTransformer)
    # a pre-ViTConfig checkpoint
    old = {"img_size": 32, "patch_size": 8, "embed_dim": TINY_DIM, "depth": 1, "num_heads": 4}
    assert build_model(old).config == ViTConfig(**old)
    with pytest.raises(ValueError, match=r"unknown model option.*registers.*accepted"):
        ViTConfig.from_dict({**old, "registers": 4})
    with pytest.raises(ValueError, match="class_token=True or pool 'avg'"):
        ViTConfig(class_token=False)
    with pytest.raises(ValueError, match="act_layer must be one of"):
        ViTConfig(act_layer="relu")
    model = vit.create_model("vit_small_patch14_reg4_dinov2", **small("vit_small_patch14_reg4_dinov2"))
    model.reset_classifier(3)
    assert model.config.num_classes == 3 and model.num_prefix_tokens == 5
