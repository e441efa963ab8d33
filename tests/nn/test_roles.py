"""Which parameters play which role (`vit.nn.roles`): every family's ViT names its own, and what asks (layer decay,
the no-decay rule, freezing) reads the same answer."""

from __future__ import annotations

import pytest

import vit
from tests.helpers import TINY_DIM
from vit.nn.roles import ParamRoles, roles_of

SMALL = {"depth": 2, "embed_dim": TINY_DIM, "num_heads": 2, "img_size": 32, "patch_size": 16}


@pytest.mark.parametrize("name", ["vit_small_patch14_reg4_dinov2", "deit_small_distilled_patch16_224",
                                  "vit_base_patch16_clip_224", "vit_base_patch16_siglip_224"])
def test_every_parameter_of_every_family_has_one_role(name):
    model = vit.create_model(name, **SMALL, num_classes=3)
    roles = model.param_roles()
    by_role = {n: roles.role(n) for n, _ in model.named_parameters()}
    assert {r for r in by_role.values()} <= {"stem", "tokens", "blocks", "pool", "head"}
    assert all(r == "blocks" for n, r in by_role.items() if n.startswith("blocks."))
    assert {n for n, r in by_role.items() if r == "head"} == {n for n, _ in model.named_parameters()
                                                             if n.startswith(("head.", "head_dist."))}
    assert set(roles.tokens) == {n for n in model.TOKENS if getattr(model, n, None) is not None}
    assert set(roles.no_decay) == set(roles.tokens)  # the tokens and positions: the learned, not the weights
    if name.endswith("siglip_224"):
        assert all(by_role[n] == "pool" for n in by_role if n.startswith("attn_pool."))
    assert roles.depth == 2 and roles.block("blocks.1.attn.qkv.weight") == 1
    assert roles.layer("blocks.1.mlp.fc1.bias") == 2 and roles.layer(roles.tokens[0]) == 0
    assert roles.layer("head.bias") == 3


def test_the_no_decay_rule_and_the_parts_by_name():
    model = vit.create_model("vit_small_patch14_reg4_dinov2", **SMALL, num_classes=3)
    roles = model.param_roles()
    assert not roles.decays("reg_token", 3) and not roles.decays("pos_embed", 3) and not roles.decays("norm.weight", 1)
    assert roles.decays("blocks.0.attn.qkv.weight", 2) and roles.decays("head.weight", 2)
    assert roles.decays("patch_embed.proj.weight", 4)
    # FSDP's and activation checkpointing's wrapped names are the same parameters
    assert roles.role("blocks.0._fsdp_wrapped_module._checkpoint_wrapped_module.attn.qkv.weight") == "blocks"
    frozen = roles.names(model, "stem", "tokens", "blocks", blocks=1)
    assert "patch_embed.proj.weight" in frozen and "reg_token" in frozen and "blocks.0.norm1.weight" in frozen
    assert not any(n.startswith(("blocks.1.", "head.", "norm.")) for n in frozen)
    assert roles.modules(model, "stem", "blocks", blocks=1) == [model.patch_embed, model.norm_pre, model.blocks[0]]


def test_a_network_that_says_nothing_has_timms_no_decay_set_alone():
    import torch

    plain = torch.nn.Linear(3, 2)
    assert roles_of(plain) == ParamRoles()
    assert roles_of(plain).role("weight") == "pool" and roles_of(plain).layer("weight") == 1
