"""Our LoRA and DoRA (`vit.nn.lora`) on our ViT against HF PEFT's on timm's ViT: the same base weights, the same A, B
(and DoRA magnitudes), the same logits (≤ 1e-5), on every choice of targets PEFT can express.

PEFT adapts whole modules: timm's fused ``qkv``, ``proj``, ``fc1`` and ``fc2``. Our q, k and v adapters on slices of
the fused qkv are a LoRA of rank (parts · r) on the whole matrix, its A the parts' As stacked and its B block
diagonal (each part's B in its own rows and columns, zero elsewhere), with alpha scaled alike so that alpha / r is
unchanged; DoRA's magnitude of an unadapted row is that row's norm (a factor of 1). The test builds those matrices
itself, from the parts, and hands them to PEFT through ``rank_pattern`` and ``alpha_pattern``.
"""

import peft
import pytest
import timm
import torch

from tests.nn.test_families import pair, small
from vit.nn.lora import LoraConfig, add_adapters, merge_adapters

NAME = "vit_base_patch16_224"  # ViT-B/16's widths and heads, 2 blocks on a 4x4 grid (tests/nn/test_families.small)
RANK, ALPHA = 4, 12.0  # alpha / r = 3, not 2 (PEFT's and our defaults' ratio): a scaling taken from elsewhere shows
PATHS = {"qkv": "attn.qkv", "proj": "attn.proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}
PARTS = ("q", "k", "v")
TARGETS = [("qkv",), ("proj",), ("fc1",), ("fc2",), ("qkv", "proj", "fc1", "fc2"),  # whole modules, as PEFT
           ("q", "v"), ("k",), ("q", "k", "v"), ("q", "v", "proj", "fc2")]  # slices: a block-structured LoRA

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def draw(layer: torch.nn.Linear, role: str, targets: tuple[str, ...], dora: bool, g: torch.Generator) -> dict:
    """Random (A, B, magnitude or None) for each adapted part of ``layer`` (the block's ``role``):
    {part: (A, B, m, first row, end row)}; the parts are q, k, v (slices of qkv) or "all"."""
    C = layer.out_features // 3
    sliced = role == "qkv" and "qkv" not in targets
    rows = {p: (i * C, (i + 1) * C) for i, p in enumerate(PARTS) if p in targets} if sliced \
        else {"all": (0, layer.out_features)}
    out = {}
    for part, (a, b) in rows.items():
        A = torch.randn(RANK, layer.in_features, generator=g) / layer.in_features**0.5
        B = torch.randn(b - a, RANK, generator=g) * 0.1
        m = (torch.linalg.vector_norm(layer.weight[a:b] + ALPHA / RANK * B @ A, dim=1)
             * (1 + 0.2 * torch.rand(b - a, generator=g))) if dora else None
        out[part] = (A, B, m, a, b)
    return out


def as_one(layer: torch.nn.Linear, parts: dict[str, tuple]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The parts as one LoRA of rank len(parts) · r on the whole layer: A stacked, B block diagonal, m per row."""
    n = len(parts) * RANK
    A = torch.cat([A for A, *_ in parts.values()])
    B = torch.zeros(layer.out_features, n)
    m = torch.linalg.vector_norm(layer.weight.detach(), dim=1)  # rows left alone: g = m / |W| = 1
    for i, (_, Bp, mp, a, b) in enumerate(parts.values()):
        B[a:b, i * RANK:(i + 1) * RANK] = Bp
        if mp is not None:
            m[a:b] = mp
    return A, B, m


def adapted_pair(targets: tuple[str, ...], dora: bool, last_blocks: int | None = None):
    """Ours and PEFT-on-timm, on the same base weights, given the same random adapters; and the base logits."""
    torch.manual_seed(0)  # timm's initialisation, before tests/nn/test_vision.perturb's noise
    theirs, ours = pair(NAME, **small(NAME))
    x = torch.randn(3, 3, *ours.img_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = ours(x)
    depth = len(ours.blocks)
    blocks = list(range(depth))[-last_blocks:] if last_blocks else list(range(depth))
    modules = sorted({"qkv" if t in PARTS else t for t in targets})
    sliced = "qkv" in modules and "qkv" not in targets
    wide = len(set(targets) & set(PARTS)) * RANK  # the block-structured qkv's rank
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=modules, use_dora=dora,
                             rank_pattern={"qkv": wide} if sliced else {},
                             alpha_pattern={"qkv": ALPHA * wide / RANK} if sliced else {},
                             layers_to_transform=blocks if last_blocks else None,
                             layers_pattern="blocks" if last_blocks else None)
    theirs = peft.get_peft_model(theirs, config)
    add_adapters(ours, LoraConfig(rank=RANK, alpha=ALPHA, targets=targets, dora=dora, last_blocks=last_blocks))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for i in blocks:
            for role in modules:
                path = f"blocks.{i}.{PATHS[role]}"
                mine, peft_layer = ours.get_submodule(path), theirs.base_model.model.get_submodule(path)
                parts = draw(peft_layer.base_layer, role, targets, dora, g)
                for part, (A, B, m, _, _) in parts.items():
                    mine.lora_A[part].copy_(A)
                    mine.lora_B[part].copy_(B)
                    if dora:
                        mine.lora_magnitude[part].copy_(m)
                A, B, m = as_one(peft_layer.base_layer, parts)
                peft_layer.lora_A["default"].weight.copy_(A)
                peft_layer.lora_B["default"].weight.copy_(B)
                if dora:
                    peft_layer.lora_magnitude_vector["default"].weight.copy_(m)
    return ours.eval(), theirs.eval(), x, base


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("targets", TARGETS, ids="+".join)
def test_our_adapters_give_peft_logits(targets, dora):
    """The same logits as PEFT's (≤ 1e-5), and far from the base model's: the adapters do change the output."""
    ours, theirs, x, base = adapted_pair(targets, dora)
    with torch.no_grad():
        want, got = theirs(x), ours(x)
    assert (got - base).abs().max() > 0.05  # the test sees the update, not two copies of the base model
    assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_adapters_on_the_last_block_only_equal_peft_layers_to_transform(dora):
    ours, theirs, x, base = adapted_pair(("q", "v", "fc1"), dora, last_blocks=1)
    assert not any("lora" in n for n, _ in ours.blocks[0].named_parameters())
    with torch.no_grad():
        want, got = theirs(x), ours(x)
    assert (got - base).abs().max() > 0.05
    assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
@pytest.mark.parametrize("targets", [("q", "v"), ("qkv", "proj", "fc1", "fc2")], ids="+".join)
def test_our_merged_weights_equal_peft_merge_and_unload(targets, dora):
    """Merged, ours is a plain timm-layout state dict equal to PEFT's merge_and_unload() (≤ 1e-5), which timm
    loads with strict=True and which gives PEFT's logits."""
    ours, theirs, x, _ = adapted_pair(targets, dora)
    with torch.no_grad():
        want = theirs(x)
    merge_adapters(ours)
    merged = theirs.merge_and_unload().state_dict()
    mine = ours.state_dict()
    assert set(mine) == set(merged)
    assert max((mine[k] - merged[k]).abs().max().item() for k in mine) <= 1e-5
    plain = timm.create_model(NAME, pretrained=False, **small(NAME)).eval()
    plain.load_state_dict(mine, strict=True)
    with torch.no_grad():
        assert (plain(x) - want).abs().max() <= 1e-5
        assert (ours(x) - want).abs().max() <= 1e-5


def test_dora_trains_with_peft_gradients():
    """In training, DoRA's weight norm ‖W + s·B A‖ is a constant (detached: the paper's §4.3, and PEFT's): a loss
    through ours and through PEFT's gives the same gradients of A, B and the magnitude (≤ 1e-5 of the largest), in
    PEFT's stacked layout, on q and v slices of the fused qkv."""
    ours, theirs, x, _ = adapted_pair(("q", "v"), dora=True)
    ours.train()
    theirs.train()
    weights = torch.randn(3, ours.num_classes, generator=torch.Generator().manual_seed(2))
    for model in (ours, theirs):
        (model(x) * weights).sum().backward()
    for i in range(len(ours.blocks)):
        mine = ours.blocks[i].attn.qkv
        peft_layer = theirs.base_model.model.blocks[i].attn.qkv
        A, B = peft_layer.lora_A["default"].weight.grad, peft_layer.lora_B["default"].weight.grad
        m = peft_layer.lora_magnitude_vector["default"].weight.grad
        C = mine.out_features // 3
        for k, (part, rows) in enumerate((("q", slice(0, C)), ("v", slice(2 * C, 3 * C)))):
            ranks = slice(k * RANK, (k + 1) * RANK)
            grads = {"A": (mine.lora_A[part].grad, A[ranks]), "B": (mine.lora_B[part].grad, B[rows, ranks]),
                     "magnitude": (mine.lora_magnitude[part].grad, m[rows])}
            for name, (got, want) in grads.items():
                assert want.abs().max() > 1e-3, name  # a gradient to compare, not zeros
                # gradients reach 28 here: within 1e-5 of the largest (without the detach: 0.02 to 0.25 of it)
                assert (got - want).abs().max() <= 1e-5 * want.abs().max(), (i, part, name)
