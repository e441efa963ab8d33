"""attention_from for both models, DINO's mass mask, and the explorer's callbacks driven headless."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.helpers import TINY_DIM, tiny_translator, tiny_vit
from vit.explain.maps import attention_rollout, collect_attention
from vit.explain.query import attention_from, mass_mask, plot_query, prefix_labels
from vit.explain.text import translation_attention
from vit.nn.vision import VisionTransformer

DIGITS = dict(depth=4, embed_dim=64, num_heads=4)  # the digits config as it is: 4 layers x 4 heads


def image():
    return torch.randn(1, 8, 8, generator=torch.Generator().manual_seed(1))


def test_a_patch_query_reads_its_own_row_of_the_weights():
    model, x = tiny_vit(**DIGITS), image()
    weights = collect_attention(model, x[None]).weights[:, 0]  # (L, H, 17, 17)
    m = attention_from(model, x, query=(2, 1), layer=1, head=3)
    row = weights[1, 3, 1 + 2 * 4 + 1]  # token index: 1 prefix + row * 4 + col
    torch.testing.assert_close(m.weights, row[1:].reshape(4, 4))
    torch.testing.assert_close(m.prefix, row[:1])
    assert m.prefix_labels == ["cls"] and m.query_label == "patch (2, 1)"
    assert torch.allclose(m.weights.sum() + m.prefix.sum(), torch.tensor(1.0))
    mean = attention_from(model, x, query=10, layer=-1, head="mean")  # the same token by index
    torch.testing.assert_close(mean.weights, weights[-1, :, 10].mean(0)[1:].reshape(4, 4))
    assert mean.query_label == "patch (2, 1)"


def test_the_cls_query_with_rollout_is_attention_rollout():
    model, x = tiny_vit(**DIGITS), image()
    m = attention_from(model, x, query="cls", rollout=True)
    expected = attention_rollout(collect_attention(model, x[None]).weights, (4, 4))[0]
    torch.testing.assert_close(m.weights, expected)
    flat, labels = m.with_prefix()
    assert flat.shape == (17,) and labels[0] == "cls" and labels[1] == "patch 0"


def test_query_errors_name_the_bad_value():
    model, x = tiny_vit(**DIGITS), image()
    with pytest.raises(ValueError, match=r"patch \(4, 0\) is outside the 4x4 patch grid"):
        attention_from(model, x, query=(4, 0))
    with pytest.raises(ValueError, match="'reg0' is not a prefix token"):
        attention_from(model, x, query="reg0")
    with pytest.raises(ValueError, match="layer 4 is out of range"):
        attention_from(model, x, layer=4)


def test_prefix_tokens_are_labelled_cls_then_registers():
    assert prefix_labels(SimpleNamespace(num_prefix_tokens=5, cls_token=object())) == [
        "cls", "reg0", "reg1", "reg2", "reg3"]
    assert prefix_labels(SimpleNamespace(num_prefix_tokens=2, cls_token=None)) == ["reg0", "reg1"]
    assert prefix_labels(SimpleNamespace(num_prefix_tokens=2, cls_token=1, dist_token=1)) == ["cls", "dist"]


def test_register_tokens_are_labelled_and_kept_apart_from_the_patches():
    torch.manual_seed(0)
    model = VisionTransformer(img_size=8, patch_size=2, in_chans=1, num_classes=3, embed_dim=TINY_DIM, depth=2,
                              num_heads=2, reg_tokens=2).eval()
    x = image()
    m = attention_from(model, x, query="reg1", layer=0, head=0)
    assert m.prefix_labels == ["cls", "reg0", "reg1"] and m.weights.shape == (4, 4)
    row = collect_attention(model, x[None]).weights[0, 0, 0, 2]  # (N,): token 2 is reg1
    torch.testing.assert_close(torch.cat([m.prefix, m.weights.flatten()]), row)


def test_mass_mask_keeps_the_fewest_entries_that_hold_the_share():
    weights = torch.tensor([[0.1, 0.4], [0.2, 0.3]])
    # ranked: 0.4, 0.3, 0.2, 0.1; the running share before each: 0, 0.4, 0.7, 0.9
    assert mass_mask(weights, 0.5).tolist() == [[False, True], [False, True]]
    assert mass_mask(weights, 0.7).tolist() == [[False, True], [False, True]]
    assert mass_mask(weights, 0.71).tolist() == [[False, True], [True, True]]
    assert mass_mask(weights, 0.0).sum() == 0 and mass_mask(weights, 1.0).all()
    with pytest.raises(ValueError, match="keep must be a share"):
        mass_mask(weights, 1.5)


def test_a_target_token_query_is_its_row_of_the_cross_attention():
    translator = tiny_translator()
    m = attention_from(translator, "3 1 4 1", query=2, layer=0, head=1, target="1 4 1 3")
    att = translation_attention(translator, "3 1 4 1", target="1 4 1 3")
    torch.testing.assert_close(m.weights, att.cross[0, 1, 2])
    assert m.labels == ["3", "1", "4", "1"] and m.query_label == "target 2: '1'"
    enc = attention_from(translator, "3 1 4 1", query=-1, kind="encoder", target="1 4 1 3")
    torch.testing.assert_close(enc.weights, att.encoder[-1].mean(0)[-1])
    with pytest.raises(ValueError, match="token index 9 is out of range"):
        attention_from(translator, "3 1 4 1", query=9, target="1 4 1 3")
    fig = plot_query(m, keep=0.5)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == m.labels


# ---- the explorer, headless: set the controls, read the PNG and the status line --------------------------
ipywidgets = pytest.importorskip("ipywidgets")
