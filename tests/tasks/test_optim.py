"""Parameter groups with layer decay, and the warm-up + cosine schedule."""

from __future__ import annotations

import pytest

import vit
from vit.tasks.optim import layer_id, param_groups, warmup_cosine


def test_param_groups_decay_and_layer_scales():
    model = vit.create_model("vit_digits_patch2_8", depth=2, embed_dim=32, num_heads=2)
    groups = param_groups(model, lr=1.0, weight_decay=0.05, layer_decay=0.5)
    names = {id(p): n for n, p in model.named_parameters()}
    seen = set()
    for g in groups:
        for p in g["params"]:
            name = names[id(p)]
            seen.add(name)
            no_decay = p.ndim <= 1 or name in ("pos_embed", "cls_token")
            assert g["weight_decay"] == (0.0 if no_decay else 0.05), name
            assert g["lr"] == pytest.approx(0.5 ** (2 + 1 - layer_id(name, 2))), name
    assert seen == set(names.values())
    assert layer_id("patch_embed.proj.weight", 2) == 0 and layer_id("cls_token", 2) == 0
    assert layer_id("blocks.1.attn.qkv.weight", 2) == 2 and layer_id("head.weight", 2) == 3
    # without layer decay, every group has the base lr
    assert {g["lr"] for g in param_groups(model, 0.1, 0.05)} == {0.1}


def test_warmup_then_cosine():
    assert warmup_cosine(0, 10, 100, 0.0) == pytest.approx(0.1)
    assert warmup_cosine(9, 10, 100, 0.0) == pytest.approx(1.0)
    assert warmup_cosine(10, 10, 100, 0.0) == pytest.approx(1.0)
    assert warmup_cosine(55, 10, 100, 0.0) == pytest.approx(0.5)
    assert warmup_cosine(100, 10, 100, 0.1) == pytest.approx(0.1)
