"""The notebook explorer (`vit.explain.widget`, AttentionExplorer): its callbacks redraw from the controls, for
images and for text."""

from __future__ import annotations

import torch

from tests.explain.test_query import DIGITS, image
from tests.helpers import tiny_translator, tiny_vit
from vit.explain.query import attention_from, mass_mask
from vit.explain.text import translation_attention


def test_image_explorer_callbacks_redraw_from_the_controls():
    from vit.explain.widget import AttentionExplorer

    model, x = tiny_vit(**DIGITS), image()
    explorer = AttentionExplorer(model, x)
    assert explorer.image.value[:8] == b"\x89PNG\r\n\x1a\n" and "<b>cls</b>" in explorer.status.value
    first = explorer.image.value
    explorer.buttons[(2, 1)].click()  # click a patch
    assert "patch (2, 1)" in explorer.status.value and explorer.image.value != first
    expected = attention_from(model, x, query=(2, 1), layer=3, head="mean")
    torch.testing.assert_close(explorer.current().weights, expected.weights)
    explorer.layer.value, explorer.head.value = 1, 2
    torch.testing.assert_close(explorer.current().weights, attention_from(model, x, (2, 1), 1, 2).weights)
    explorer.rollout.value = True
    torch.testing.assert_close(explorer.current().weights,
                               attention_from(model, x, (2, 1), 1, 2, rollout=True).weights)
    explorer.keep.value = 0.5
    kept = int(mass_mask(explorer.current().weights, 0.5).sum())
    assert f"{kept} of 16 kept" in explorer.status.value
    explorer.show_prefix.value = False
    assert len(explorer.figure().axes) == 1  # the prefix bar is dropped
    explorer.buttons["cls"].click()
    assert "<b>cls, rollout to layer 1</b>" in explorer.status.value
    bundle = explorer._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "image/png" in bundle  # static fallback


def test_text_explorer_picks_tokens_and_kinds():
    from vit.explain.widget import AttentionExplorer

    translator = tiny_translator()
    explorer = AttentionExplorer(translator, "3 1 4 1", target="1 4 1 3")
    att = translation_attention(translator, "3 1 4 1", target="1 4 1 3")
    explorer.set_query(2)
    torch.testing.assert_close(explorer.current().weights, att.cross[-1].mean(0)[2])
    explorer.kind.value = "decoder"
    assert [label for label, _ in explorer.token.options][:2] == ["0: 1", "1: 4"]
    explorer.token.value, explorer.head.value = 3, 0
    torch.testing.assert_close(explorer.current().weights, att.decoder[-1, 0, 3])
    assert "decoder: '3'" in explorer.status.value and explorer.rollout.disabled
