"""The Vision Transformer: shapes, configs, timm layout and numerics, image-size rules."""

import pytest
import timm
import torch

import vit
from tests.helpers import tiny_vit
from vit.checkpoints.convert import convert_layer_scale
from vit.nn.attention import MultiHeadAttention
from vit.nn.vision import MODEL_CONFIGS

RGB32 = dict(img_size=32, patch_size=8, in_chans=3, num_heads=4, num_classes=5)  # 16 patches + cls: 17 tokens


def perturb(model: torch.nn.Module, scale: float = 0.05) -> torch.nn.Module:
    """Move every weight off its init so that no term hides (zero biases, unit norms)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def test_patch_embedding_gives_196_tokens_plus_cls():
    model = vit.create_model("vit_tiny_patch16_224")
    x = torch.randn(1, 3, 224, 224)
    assert model.patch_embed(x).shape == (1, 196, 192)
    assert model.embed(x).shape == (1, 197, 192)
    assert model.pos_embed.shape == (1, 197, 192)
    assert model.forward_features(x).shape == (1, 197, 192)
    assert model(x).shape == (1, 1000)


def test_named_configs_have_timm_state_dict_layout():
    """Every timm-named config has exactly timm's keys and shapes (built on meta: no memory); timm's Eva (DINOv3)
    after its gamma_1/2 and q/v biases are renamed (`vit.checkpoints.convert.convert_layer_scale`)."""
    with torch.device("meta"):
        for name in vit.list_models():
            ours = vit.create_model(name).state_dict()
            if timm.is_model(name):
                theirs = convert_layer_scale(timm.create_model(name).state_dict())
                assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}, name
        ours = vit.create_model("vit_small_patch16_224", global_pool="avg").state_dict()
        theirs = timm.create_model("vit_small_patch16_224", global_pool="avg").state_dict()
        assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}


def test_small_image_configs():
    cifar = vit.create_model("vit_cifar_patch4_32")
    assert cifar(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert cifar.patch_embed.num_patches == 64 and len(cifar.blocks) == 9
    digits = vit.create_model("vit_digits_patch2_8")
    assert digits(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    assert digits.patch_embed.num_patches == 16


@pytest.mark.parametrize("global_pool", ["token", "avg"])
def test_matches_timm_on_same_weights(global_pool):
    theirs = perturb(timm.create_model("vit_tiny_patch16_224", global_pool=global_pool, num_classes=7)).eval()
    ours = vit.create_model("vit_tiny_patch16_224", global_pool=global_pool, num_classes=7).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), theirs.forward_features(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(
            ours.forward_head(ours.forward_features(x), pre_logits=True),
            theirs.forward_head(theirs.forward_features(x), pre_logits=True),
            atol=1e-4, rtol=1e-4,
        )


def test_dynamic_img_size_matches_timm():
    theirs = perturb(timm.create_model("vit_tiny_patch16_224", dynamic_img_size=True)).eval()
    ours = vit.create_model("vit_tiny_patch16_224", dynamic_img_size=True).eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(1, 3, 160, 256)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)


def test_cls_only_last_block_equals_full_forward_including_gradients():
    """forward() computes only the cls row in the last block; it must equal the full path."""
    torch.manual_seed(0)
    model = perturb(tiny_vit(**RGB32))
    x = torch.randn(3, 3, 32, 32)
    fast = model(x)
    full = model.forward_head(model.forward_features(x))
    torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-5)
    fast_grads = torch.autograd.grad(fast.square().sum(), list(model.parameters()))
    full_grads = torch.autograd.grad(full.square().sum(), list(model.parameters()))
    for a, b in zip(fast_grads, full_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_forward_attention_returns_every_layer_and_the_same_logits():
    model = perturb(tiny_vit(**RGB32)).eval()
    x = torch.randn(2, 3, 32, 32)
    logits, weights = model.forward_attention(x)
    torch.testing.assert_close(logits, model(x), atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, 2, 4, 17, 17)  # (layers, B, heads, tokens, tokens)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 4, 17))
    _, last = model.forward_attention(x, layers=[-1])
    assert last.shape == (1, 2, 4, 17, 17)
    torch.testing.assert_close(last[0], weights[1])


def test_wrong_image_size_is_a_clear_error():
    model = tiny_vit(**RGB32)
    with pytest.raises(ValueError, match=r"expected a 32x32 input, got 40x32.*dynamic_img_size"):
        model(torch.randn(1, 3, 40, 32))
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        tiny_vit(**{**RGB32, "img_size": 30})
    dynamic = tiny_vit(**RGB32, dynamic_img_size=True)
    assert dynamic(torch.randn(1, 3, 48, 16)).shape == (1, 5)
    with pytest.raises(ValueError, match="not divisible by the patch size"):
        dynamic(torch.randn(1, 3, 36, 32))
    with pytest.raises(ValueError, match="channels"):
        model(torch.randn(3, 32, 32))


def test_unknown_model_name_lists_known_ones():
    with pytest.raises(ValueError, match="vit_small_patch16_224"):
        vit.create_model("vit_huge_patch99")
    with pytest.raises(ValueError, match=r"unknown option.*drop_pth_rate.*drop_path_rate"):
        vit.create_model("vit_tiny_patch16_224", drop_pth_rate=0.1)
    assert set(vit.list_models()) == set(MODEL_CONFIGS)
    for name in ["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224",
                 "vit_large_patch16_224", "vit_base_patch32_224"]:
        assert name in vit.list_models()


def test_init_follows_timm_and_drop_path_rises_linearly():
    model = tiny_vit(**RGB32, depth=5, embed_dim=64, drop_path_rate=0.2)
    assert [b.drop_path1.p for b in model.blocks] == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])
    assert model.cls_token.std() < 1e-5
    assert 0.01 < model.pos_embed.std() < 0.03
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert all((m.bias == 0).all() for m in linears)
    assert all(0.015 < m.weight.std() < 0.025 for m in linears)
    assert all(isinstance(b.attn, MultiHeadAttention) for b in model.blocks)
    assert all(b.norm1.eps == 1e-6 for b in model.blocks)
    assert model.no_weight_decay() == timm.create_model("vit_tiny_patch16_224").no_weight_decay()  # timm's set


def test_reset_classifier_and_pre_logits():
    model = tiny_vit(**RGB32)
    model.reset_classifier(3)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    model.reset_classifier(0)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 32)


def test_stochastic_depth_only_in_training():
    model = tiny_vit(**RGB32, drop_path_rate=0.5).eval()
    x = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(model(x), model(x))
    model.train()
    torch.manual_seed(0)
    a = model(x)
    torch.manual_seed(1)
    assert not torch.allclose(a, model(x))


def test_compiles_as_one_graph_without_breaks():
    """The README's claim: torch.compile sees the forward (and the attention path) as one graph."""
    import torch._dynamo

    model = tiny_vit()
    x = torch.randn(2, 1, 8, 8)
    for fn in (model, lambda images: model.forward_attention(images)):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(fn)(x)
        assert explained.graph_break_count == 0, explained.break_reasons
        assert explained.graph_count == 1
