"""The CLIP and SigLIP towers on vit's blocks give open_clip's embeddings (random weights, 2 blocks a tower, the
named configs' widths and flags), and the zero-shot classifier scores as `CLIP.forward` does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import TINY_DIM
from tests.openclip import CLIP_NAMES, openclip_model
from vit.checkpoints.clip import _load, _open_clip_configs
from vit.checkpoints.convert_clip import split_towers
from vit.nn.blocks import EncoderBlock
from vit.nn.clip import CLIP, CLIPTextConfig, TextTower
from vit.nn.configs import ViTConfig


def ours_from(model: torch.nn.Module, cfg: dict) -> CLIP:
    vision, text, scalars = split_towers(model.state_dict())
    v_cfg, t_cfg = _open_clip_configs(vision, text, {"model_cfg": cfg}, "logit_bias" in scalars, Path("x"))
    ours = CLIP(v_cfg, t_cfg, logit_bias="logit_bias" in scalars)
    _load(ours, {f"visual.{k}": v for k, v in vision.items()} | {f"text.{k}": v for k, v in text.items()} | scalars,
          Path("x"))
    return ours.eval()


def text_ids(vocab: int, context: int, eot: bool, seed: int = 0) -> torch.Tensor:
    """Rows of random ids of several lengths; with ``eot`` each ends in the highest id, padded with 0 (CLIP)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, min(vocab - 1, 5000), (4, context), generator=g)
    if eot:
        for row, length in enumerate((3, 9, min(20, context - 1), context)):
            ids[row, length - 1] = vocab - 1
            ids[row, length:] = 0
    return ids


@pytest.mark.parametrize("name", CLIP_NAMES)
def test_embeddings_equal_open_clips(name):
    model, cfg = openclip_model(name)
    ours = ours_from(model, cfg)
    tc = ours.text.config
    assert tc.act_layer == ("quick_gelu" if "quickgelu" in name else "gelu")
    assert (tc.causal, tc.pool, tc.proj_bias) == ((False, "last", True) if "SigLIP" in name else (True, "eot", False))
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    ids = text_ids(tc.vocab_size, tc.context_length, eot=tc.pool == "eot")
    with torch.no_grad():
        assert torch.allclose(ours.encode_image(images), model.encode_image(images), atol=1e-4, rtol=0)
        assert torch.allclose(ours.encode_text(ids), model.encode_text(ids), atol=1e-4, rtol=0)
        image_logits, _ = model.get_logits(images, ids)
        assert torch.allclose(ours(images, ids), image_logits, atol=1e-3, rtol=0)


@pytest.mark.slow
def test_full_depth_vit_b_32_equals_open_clip():
    """ViT-B-32 at its real 12 blocks a tower (random weights): rounding does not grow past the bar with depth."""
    model, cfg = openclip_model("ViT-B-32", layers=12)
    ours = ours_from(model, cfg)
    assert len(ours.visual.blocks) == len(ours.text.blocks) == 12
    images = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    ids = text_ids(49408, 77, eot=True)
    with torch.no_grad():
        image = (ours.encode_image(images) - model.encode_image(images)).abs().max().item()
        text = (ours.encode_text(ids) - model.encode_text(ids)).abs().max().item()
    print(f"ViT-B-32, 12 blocks a tower: max |diff| image {image:.2e}, text {text:.2e}")
    assert image <= 1e-4 and text <= 1e-4


def test_the_causal_mask_and_eot_pooling_matter():
    """A text tower without the causal mask, or pooled elsewhere, gives other embeddings (the test above can fail)."""
    model, cfg = openclip_model("ViT-B-32")
    ours = ours_from(model, cfg)
    ids = text_ids(49408, 77, eot=True)
    with torch.no_grad():
        want = model.encode_text(ids)
        for change in ({"causal": False}, {"pool": "last"}):
            other = TextTower(ours.text.config.replace(**change)).eval()
            other.load_state_dict(ours.text.state_dict())
            assert (other(ids) - want).abs().max() > 1e-2


def test_classifier_scores_as_forward_and_is_an_ordinary_vit():
    torch.manual_seed(0)
    vision = ViTConfig(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=0, proj_dim=48,
                       pre_norm=True)
    text = CLIPTextConfig(vocab_size=100, context_length=16, embed_dim=TINY_DIM, num_heads=4, depth=2, output_dim=48)
    for bias in (False, True):
        model = CLIP(vision, text, logit_bias=bias).eval()
        ids = text_ids(100, 16, eot=True)
        classifier = model.classifier(model.encode_text(ids).detach())
        images = torch.randn(3, 3, 32, 32)
        with torch.no_grad():
            assert torch.allclose(classifier(images), model(images, ids), atol=1e-5)
        assert classifier.config.num_classes == 4 and classifier.config.normalize_embedding
        assert set(classifier.state_dict()) == set(model.visual.state_dict()) | {"head.weight", "head.bias"}


def test_text_blocks_are_the_vits_blocks_and_configs_round_trip():
    text = CLIPTextConfig(vocab_size=100, context_length=16, embed_dim=TINY_DIM, num_heads=4, depth=2, output_dim=0)
    tower = TextTower(text)
    assert all(type(b) is EncoderBlock for b in tower.blocks)
    model = CLIP(ViTConfig(img_size=32, patch_size=8, embed_dim=TINY_DIM, depth=1, num_heads=4, num_classes=0), text)
    assert CLIP.from_dict(model.to_dict()).to_dict() == model.to_dict()
    with pytest.raises(ValueError, match="num_classes must be 0"):
        CLIP(ViTConfig(num_classes=10, depth=1), text)
    with pytest.raises(ValueError, match="pool must be"):
        CLIPTextConfig(pool="mean")
    with pytest.raises(ValueError, match=r"expected token ids"):
        tower(torch.zeros(2, 17, dtype=torch.long))
