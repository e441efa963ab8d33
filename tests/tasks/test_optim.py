"""Parameter groups with layer decay, the warm-up + cosine schedule, and the fused AdamW."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_vit
from vit.tasks.optim import adamw, param_groups, warmup_cosine


def test_param_groups_decay_and_layer_scales():
    model = tiny_vit()
    groups = param_groups(model, lr=1.0, weight_decay=0.05, layer_decay=0.5)
    names = {id(p): n for n, p in model.named_parameters()}
    layer_id = lambda name, depth: model.param_roles().layer(name)  # the model says it
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


def test_adamw_is_fused_on_a_cpu_and_updates_as_the_per_tensor_loop():
    model = tiny_vit()
    twin = tiny_vit()
    twin.load_state_dict(model.state_dict())
    start = model.blocks[0].attn.qkv.weight.detach().clone()
    fused = adamw(param_groups(model, 1e-2, 0.05, 0.75), lr=1e-2, betas=(0.9, 0.95))
    loop = torch.optim.AdamW(param_groups(twin, 1e-2, 0.05, 0.75), lr=1e-2, betas=(0.9, 0.95), foreach=False)
    assert fused.defaults["fused"] and not loop.defaults["fused"]
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    for _ in range(3):
        for net, optimizer in ((model, fused), (twin, loop)):
            torch.nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    for (name, a), b in zip(model.state_dict().items(), twin.state_dict().values()):
        if name.endswith("qkv.bias"):  # the key bias's gradient is 0 but for rounding, which Adam scales up to lr
            a, b = a[torch.arange(len(a)) // 32 != 1], b[torch.arange(len(b)) // 32 != 1]
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    assert (model.blocks[0].attn.qkv.weight - start).abs().max() > 1e-3  # they did move


@pytest.mark.parametrize("schedule", ["onecycle", "cosine"])
def test_the_parameter_table_shows_the_peak_lr_of_either_schedule(schedule):
    """OneCycleLR starts at max_lr / 25: the table must show the peak the schedule reaches, not its start."""
    from vit.tasks.optim import describe_param_groups, one_cycle

    model = tiny_vit()
    groups = param_groups(model, lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    optimizer = adamw(groups, lr=1e-3, betas=(0.9, 0.999))
    if schedule == "onecycle":
        scheduler = one_cycle(optimizer, 10, 100)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_cosine(step, 10, 100, 0.0))
    seen = []
    for _ in range(100):
        seen.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    reached = torch.tensor(seen).max(0).values.tolist()  # each group's highest lr over the run
    assert reached[-1] == pytest.approx(1e-3, rel=0.02)  # the head's: the lr asked for
    rows = describe_param_groups(optimizer).splitlines()[1:]
    shown = [float(row.split()[2]) for row in rows]
    assert shown == pytest.approx(reached, rel=0.02)
