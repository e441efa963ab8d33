"""LoRA and DoRA adapters (`vit.nn.lora`): step 0 is the base model bit for bit, the merge is exact on every
family of V-backbones-exact, and each layer computes what the papers' formulas (written out here) compute."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vit
from tests.nn.test_families import FAMILIES, small
from tests.nn.test_vision import perturb
from vit.errors import UserValueError
from vit.nn.lora import (
    LoraConfig,
    LoraLinear,
    adapter_names,
    adapter_state_dict,
    add_adapters,
    base_digest,
    base_layers,
    has_adapters,
    init_magnitudes,
    merge_adapters,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

FIRST = [names[0] for names in FAMILIES.values()]  # one model of each family
ALL_ROLES = ("q", "k", "v", "proj", "fc1", "fc2")


def family_model(name: str) -> torch.nn.Module:
    """The family's token layout, positions, pool and heads at two blocks of width 64 (seconds, not minutes)."""
    return perturb(vit.create_model(name, **small(name), embed_dim=64, num_heads=2)).eval()


def train_adapters(model: torch.nn.Module, scale: float = 0.05) -> None:
    """Move every adapter off its start (B is zero there, so the update would hide)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p) * scale)


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("name", FIRST)
def test_step0_equals_base_and_merge_is_exact_on_every_family(name, dora):
    model = family_model(name)
    x = torch.randn(2, 3, *model.img_size)
    with torch.no_grad():
        base = model(x)
        add_adapters(model, LoraConfig(rank=4, targets=ALL_ROLES, dora=dora))
        assert torch.equal(model(x), base)  # B = 0 (and m = ‖W‖): the base model, bit for bit
        train_adapters(model)
        adapted = model(x)
        assert (adapted - base).abs().max() > 1e-3  # the adapters do change the model
        merge_adapters(model)
        assert not has_adapters(model)
        # fp32 sums in another order: within 1e-5 of each logit's size (SigLIP-B's reach 10)
        torch.testing.assert_close(model(x), adapted, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("targets", [("q", "v"), ("k",), ("qkv",), ("proj", "fc2"), ALL_ROLES])
def test_merged_state_dict_has_the_base_keys_and_shapes(targets):
    model = family_model("vit_small_patch14_reg4_dinov2")
    want = {k: v.shape for k, v in model.state_dict().items()}
    add_adapters(model, LoraConfig(rank=2, targets=targets, dora=True))
    assert adapter_names(model)  # adapters exist, under their own names
    assert {k: v.shape for k, v in model.state_dict().items() if "lora_" not in k} == want
    merge_adapters(model)
    assert {k: v.shape for k, v in model.state_dict().items()} == want


def by_hand(layer: LoraLinear, x: torch.Tensor, dora: bool) -> torch.Tensor:
    """The papers' formulas, row range by row range, from the raw tensors."""
    W, b = layer.weight.detach().clone(), layer.bias.detach()
    s = layer.scaling
    for part, (lo, hi) in layer.parts.items():
        rows = W[lo:hi] + s * layer.lora_B[part].detach() @ layer.lora_A[part].detach()
        if dora:
            rows = layer.lora_magnitude[part].detach()[:, None] * rows / rows.norm(dim=1, keepdim=True)
        W[lo:hi] = rows
    return x @ W.T + b


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("targets", [("q", "v"), ("k",), ("qkv",)])
def test_the_fused_qkv_adapters_compute_the_formula_on_their_slices(targets, dora):
    model = family_model("deit3_small_patch16_224")
    add_adapters(model, LoraConfig(rank=3, alpha=5.0, targets=targets, dora=dora))
    qkv = model.blocks[0].attn.qkv
    assert isinstance(qkv, LoraLinear)
    train_adapters(model)
    x = torch.randn(5, qkv.in_features)
    with torch.no_grad():
        got, want = qkv(x), by_hand(qkv, x, dora)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        C = qkv.in_features
        untouched = [i for i, p in enumerate("qkv") if p not in targets and targets != ("qkv",)]
        for i in untouched:  # the rows of a slice without an adapter are the base layer's
            rows = slice(i * C, (i + 1) * C)
            torch.testing.assert_close(got[:, rows], F.linear(x, qkv.weight, qkv.bias)[:, rows], rtol=0, atol=1e-6)
        torch.testing.assert_close(qkv(x, rows=slice(C, None)), want[:, C:], rtol=0, atol=1e-5)


def test_dora_magnitude_trains_the_row_norms():
    """With B at zero, DoRA's m alone rescales each row: the output is (m / ‖W‖) ⊙ W x + b."""
    model = family_model("vit_base_patch16_siglip_224")
    add_adapters(model, LoraConfig(rank=2, targets=("fc1",), dora=True))
    fc1 = model.blocks[1].mlp.fc1
    with torch.no_grad():
        fc1.lora_magnitude["all"].mul_(torch.linspace(0.5, 2.0, fc1.out_features))
        x = torch.randn(3, fc1.in_features)
        W = fc1.weight
        want = (fc1.lora_magnitude["all"] / W.norm(dim=1)) * (x @ W.T) + fc1.bias
        torch.testing.assert_close(fc1(x), want, rtol=0, atol=1e-5)


def test_only_the_adapters_get_gradients_when_the_base_is_frozen():
    model = family_model("vit_small_patch16_dinov3")
    add_adapters(model, LoraConfig(rank=2, targets=("q", "v", "fc1")))
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
    train_adapters(model)
    model.train()
    model(torch.randn(2, 3, *model.img_size)).sum().backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert grads == set(adapter_names(model))
    assert all(model.get_parameter(n).grad.abs().sum() > 0 for n in grads)


def test_last_blocks_adapts_only_the_last_ones():
    model = vit.create_model("vit_tiny_patch16_224", depth=3, img_size=32)
    add_adapters(model, LoraConfig(targets=("proj",), last_blocks=1))
    assert [isinstance(b.attn.proj, LoraLinear) for b in model.blocks] == [False, False, True]
    other = vit.create_model("vit_tiny_patch16_224", depth=3, img_size=32)
    add_adapters(other, LoraConfig(targets=("proj",), last_blocks=None))
    assert all(isinstance(b.attn.proj, LoraLinear) for b in other.blocks)


def test_base_layers_loads_base_weights_under_adapters():
    model = vit.create_model("vit_tiny_patch16_224", depth=2, img_size=32)
    add_adapters(model, LoraConfig(targets=("q", "v"), dora=True))
    base = perturb(vit.create_model("vit_tiny_patch16_224", depth=2, img_size=32)).eval()
    with base_layers(model):
        assert not has_adapters(model)
        model.load_state_dict(base.state_dict())  # strict: timm's keys, nothing more
    assert has_adapters(model)
    init_magnitudes(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model.eval()(x), base(x))


def test_adapter_state_dict_and_base_digest():
    model = vit.create_model("vit_tiny_patch16_224", depth=2, img_size=32)
    before = base_digest(model.state_dict())
    add_adapters(model, LoraConfig(rank=2, targets=("q", "v")))
    assert set(adapter_state_dict(model)) == {f"blocks.{i}.attn.qkv.lora_{m}.{p}" for i in range(2)
                                              for m in "AB" for p in "qv"}
    assert base_digest(model.state_dict()) == before  # the adapters are not the base
    assert base_digest(model.state_dict(), leave_out=["head.weight"]) != before
    with torch.no_grad():
        model.blocks[0].norm1.weight.add_(1e-3)
    assert base_digest(model.state_dict()) != before


@pytest.mark.parametrize("cfg, words", [
    (dict(targets=("q", "x")), "some of"), (dict(targets=("qkv", "q")), "twice"), (dict(rank=0), "rank"),
    (dict(dropout=1.0), "dropout"), (dict(last_blocks=0), "last_blocks"), (dict(targets=()), "some of")])
def test_config_errors_name_the_setting(cfg, words):
    with pytest.raises(UserValueError, match=words):
        LoraConfig(**cfg)


def test_last_blocks_beyond_the_depth_and_twice_adapted_are_errors():
    model = vit.create_model("vit_tiny_patch16_224", depth=2, img_size=32)
    with pytest.raises(UserValueError, match="2 blocks"):
        add_adapters(model, LoraConfig(last_blocks=3))
    add_adapters(model, LoraConfig(last_blocks=2))
    with pytest.raises(UserValueError, match="already"):
        add_adapters(model, LoraConfig())
