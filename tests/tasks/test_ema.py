"""The EMA of a task's weights: timm's warmed-up ModelEmaV3, or PartialEma of what trains over a shared frozen base."""

from __future__ import annotations

import torch
from timm.utils import ModelEmaV3
from torch import nn

from vit.tasks.ema import PartialEma, check_ema_sharding, ema_copy


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))


def test_no_decay_no_copy_and_the_copy_never_takes_gradients():
    assert ema_copy(net(), None) is None
    ema = ema_copy(net(), 0.9)
    assert type(ema) is ModelEmaV3 and ema.training  # train mode: no Lightning warning at fit start
    assert not any(p.requires_grad for p in ema.parameters())


def test_the_partial_ema_averages_what_trains_and_shares_the_rest():
    model = net()
    ema = ema_copy(model, 0.9, trained=frozenset({"1.weight"}))
    assert isinstance(ema, PartialEma)
    assert ema.module[0].weight is model[0].weight  # the frozen base: one tensor, not a copy
    start = ema.module[1].weight.clone()
    with torch.no_grad():
        model[1].weight.add_(1.0)
    ema.update(model, step=10**6)  # the warm-up over: the decay is 0.9
    decay = min(0.9, 1 - (1 + 10**6) ** (-2 / 3))
    expected = start + (1 - decay) * (model[1].weight - start)  # lerp by hand
    torch.testing.assert_close(ema.module[1].weight, expected)
    assert ema.module[1].bias is model[1].bias  # not trained: shared too


def test_no_sharding_no_complaint():
    check_ema_sharding(None, ema_copy(net(), 0.9))  # (FSDP's refusal: tests/tasks/test_adapters.py)


def test_the_partial_ema_moves_by_one_minus_the_decay_and_is_the_weights_at_a_warm_up_step():
    """PartialEma by the hand formula e <- d·e + (1 - d)·w: decay 0.9 and the weight up by 1 move the average by
    0.1; at step 1 of timm's warm-up the decay is 0, and the average is the weights. The frozen layer is shared."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    ema = PartialEma(model, 0.9, frozenset({"0.weight", "0.bias"}))
    assert ema.module[1].weight is model[1].weight  # not copied, not averaged
    before = ema.module[0].weight.detach().clone()
    with torch.no_grad():
        model[0].weight += 1
    ema.update(model)  # no step: the decay itself
    torch.testing.assert_close(ema.module[0].weight - before, torch.full_like(before, 0.1), rtol=0, atol=1e-6)
    with torch.no_grad():
        model[0].weight.mul_(-2)
    ema.update(model, step=1)  # timm's first step: decay 0
    assert ema.get_decay(1) == 0.0
    torch.testing.assert_close(ema.module[0].weight, model[0].weight, rtol=0, atol=0)
    # a step of the warm-up: d = 1 - (1 + (step - 1))^(-2/3), by hand
    before, decay = ema.module[0].weight.detach().clone(), 1 - 3 ** (-2 / 3)
    with torch.no_grad():
        model[0].weight += 1
    ema.update(model, step=3)
    torch.testing.assert_close(ema.module[0].weight, decay * before + (1 - decay) * model[0].weight, rtol=0,
                               atol=1e-6)
