"""Shifted Patch Tokenization and Locality Self-Attention (Lee et al., 2021) against hand computations."""

from __future__ import annotations

import pytest
import timm
import torch

import vit
from tests.helpers import TINY_DIM, tiny_vit
from vit.deploy import load_classifier
from vit.errors import UserValueError
from vit.explain import collect_attention
from vit.nn.attention import MultiHeadAttention
from vit.nn.vision import PatchEmbed
from vit.tasks.optim import param_groups

RGB16 = dict(img_size=16, patch_size=4, in_chans=3, num_heads=4, num_classes=5)  # 16 patches + cls: 17 tokens
BOTH = dict(shifted_patches=True, locality_attention=True)


def perturb(model: torch.nn.Module, scale: float = 0.1) -> torch.nn.Module:
    """Move every weight off its init (unit norms, zero biases, equal per-head scales) so no term hides."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


# ---- Locality Self-Attention ---------------------------------------------------------------------
def hand_lsa(attn: MultiHeadAttention, x: torch.Tensor, num_queries: int | None = None):
    """softmax over keys of q·k·scale_h with each query's own key at -inf, by explicit loops over heads."""
    B, N, C = x.shape
    H, D = attn.num_heads, attn.head_dim
    n = N if num_queries is None else num_queries
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias  # (B, N, 3C)
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    weights = torch.zeros(B, H, n, N, dtype=x.dtype)
    out = torch.zeros(B, n, C, dtype=x.dtype)
    for h in range(H):
        cols = slice(h * D, (h + 1) * D)
        logits = q[:, :n, cols] @ k[:, :, cols].transpose(1, 2) * attn.learned_scale[h]  # (B, n, N)
        for i in range(n):
            logits[:, i, i] = float("-inf")  # query i is token i
        weights[:, h] = torch.softmax(logits, dim=-1)
        out[:, :, cols] = weights[:, h] @ v[:, :, cols]
    return out @ attn.proj.weight.T + attn.proj.bias, weights


@pytest.mark.parametrize("num_queries", [None, 1, 3])
def test_locality_attention_matches_a_hand_formula_on_both_paths(num_queries):
    attn = perturb(MultiHeadAttention(16, 4, locality_attention=True)).double().eval()
    assert len(set(attn.learned_scale.tolist())) == 4  # distinct per head, so a mix-up shows
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    queries, context = (x, None) if num_queries is None else (x[:, :num_queries], x)
    expected, expected_weights = hand_lsa(attn, x, num_queries)
    with torch.no_grad():
        fast = attn(queries, context)
        explicit, weights = attn(queries, context, return_attention=True)
    torch.testing.assert_close(fast, expected)
    torch.testing.assert_close(explicit, expected)
    torch.testing.assert_close(weights, expected_weights)
    assert torch.all(weights.diagonal(dim1=-2, dim2=-1) == 0)


def test_locality_attention_starts_at_the_plain_scale_and_only_on_self_attention():
    attn = MultiHeadAttention(32, 4, locality_attention=True)
    torch.testing.assert_close(attn.learned_scale.detach(), torch.full((4,), 8 ** -0.5))  # τ = √head_dim
    assert MultiHeadAttention(32, 4).learned_scale is None
    with pytest.raises(ValueError, match="self-attention"):
        MultiHeadAttention(32, 4, cross=True, locality_attention=True)


def test_locality_attention_runs_under_bf16_autocast():
    attn = MultiHeadAttention(16, 4, locality_attention=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(torch.randn(2, 5, 16))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


# ---- the VisionTransformer -------------------------------------------------------------------------
def test_defaults_keep_timm_keys_and_options_add_only_their_own():
    with torch.device("meta"):
        theirs = {k: v.shape for k, v in timm.create_model("vit_tiny_patch16_224").state_dict().items()}
        default = vit.create_model("vit_tiny_patch16_224", shifted_patches=False, locality_attention=False)
        assert {k: v.shape for k, v in default.state_dict().items()} == theirs
        assert isinstance(default.patch_embed, PatchEmbed)
        ours = vit.create_model("vit_tiny_patch16_224", **BOTH).state_dict()
    added = {f"blocks.{i}.attn.learned_scale" for i in range(12)} | {"patch_embed.norm.weight", "patch_embed.norm.bias"}
    assert set(ours) == set(theirs) | added
    assert ours["patch_embed.proj.weight"].shape == (192, 5 * 3 * 16 * 16)
    assert ours["blocks.0.attn.learned_scale"].shape == (3,)


def test_model_with_both_options_keeps_its_api():
    model = perturb(tiny_vit(**RGB16, **BOTH)).eval()
    assert model.in_chans == 3 and model.patch_embed.num_patches == 16 and model.patch_embed.grid_size == (4, 4)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        logits = model(x)  # the last block runs the cls query alone: its own-key mask must stay on key 0
        torch.testing.assert_close(logits, model.forward_head(model.forward_features(x)))
        same, weights = model.forward_attention(x)
    torch.testing.assert_close(same, logits)
    assert weights.shape == (2, 2, 4, 17, 17) and torch.all(weights.diagonal(dim1=-2, dim2=-1) == 0)
    maps = collect_attention(model, x)
    assert maps.cls_maps().shape == (2, 2, 4, 4, 4) and maps.rollout().shape == (2, 4, 4)
    dynamic = tiny_vit(**RGB16, **BOTH, dynamic_img_size=True)
    assert dynamic(torch.randn(1, 3, 24, 20)).shape == (1, 5)


def test_tiny_model_with_both_options_trains_and_reaches_the_new_parameters():
    torch.manual_seed(0)
    model = tiny_vit(**RGB16, **BOTH)
    groups = param_groups(model, lr=1e-3, weight_decay=0.05)
    no_decay = {id(p) for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert all(id(b.attn.learned_scale) in no_decay for b in model.blocks)  # decay would flatten attention
    optimizer = torch.optim.AdamW(groups)
    x, y = torch.randn(8, 3, 16, 16), torch.arange(8) % 5
    before = model.blocks[0].attn.learned_scale.detach().clone()
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        assert torch.isfinite(loss)
        for name in ("blocks.0.attn.learned_scale", "blocks.1.attn.learned_scale", "patch_embed.norm.weight",
                     "patch_embed.proj.weight"):
            grad = model.get_parameter(name).grad
            assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name
        optimizer.step()
    assert not torch.equal(model.blocks[0].attn.learned_scale.detach(), before)


def test_classifier_checkpoint_round_trips_and_safetensors_export_says_why_not(tmp_path):
    from vit.checkpoints.meta import META_KEY
    from vit.deploy.export import export_safetensors
    from vit.tasks.classify import ImageClassifier

    task = ImageClassifier(model="vit_digits_patch2_8", model_kwargs=dict(depth=2, embed_dim=TINY_DIM, **BOTH))
    perturb(task.model)
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": task.state_dict(), META_KEY: task.checkpoint_meta()}, path)
    classifier = load_classifier(path)
    assert classifier.model.shifted_patches and classifier.model.locality_attention
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(classifier(x), task.model.eval()(x))
    with pytest.raises(UserValueError, match="shifted_patches or locality_attention"):
        export_safetensors(classifier, tmp_path / "out")
    assert not (tmp_path / "out").exists()
