"""The exponential moving average of a task's weights (``optim.ema_decay``): timm's warmed-up ``ModelEmaV3``, or
`PartialEma` of the parameters that train when the rest is a frozen base (adapters, `vit.tasks.finetune.Adapters`).
Validation, test and prediction use it; the task updates it after every optimiser step."""

from __future__ import annotations

from typing import Any

import torch
from timm.utils import ModelEmaV3
from torch import nn

from vit.errors import UserValueError


class PartialEma(ModelEmaV3):
    """timm's warmed-up EMA of the ``trained`` parameters alone; the frozen base's parameters are the model's own
    (shared, not copied: no second backbone in memory, none averaged)."""

    def __init__(self, model: nn.Module, decay: float, trained: frozenset[str]) -> None:
        super().__init__(model, decay=decay, use_warmup=True)
        self.trained = sorted(trained)
        for name, p in model.named_parameters():
            if name not in trained:
                owner, _, leaf = name.rpartition(".")
                self.module.get_submodule(owner)._parameters[leaf] = p

    @torch.no_grad()
    def update(self, model: nn.Module, step: int | None = None) -> None:
        """Move the averaged parameters towards ``model``'s by the step's decay."""
        decay = self.get_decay(step)
        mine, theirs = dict(self.module.named_parameters()), dict(model.named_parameters())
        torch._foreach_lerp_([mine[n] for n in self.trained], [theirs[n].detach() for n in self.trained],
                             weight=1.0 - decay)


def ema_copy(model: nn.Module, decay: float | None, trained: frozenset[str] | None = None) -> ModelEmaV3 | None:
    """timm's ``ModelEmaV3`` of ``model`` (None without a decay), warmed up: the decay grows with the step
    (1 - (1 + step)^-2/3, capped at ``decay``), so a short run's EMA is not mostly its random initialisation.
    With ``trained`` (adapters), the EMA averages those parameters alone and shares the frozen base's tensors."""
    if decay is None:
        return None
    ema = ModelEmaV3(model, decay=decay, use_warmup=True) if trained is None else PartialEma(model, decay, trained)
    # The copy follows the weights by averaging, never by gradients: freeze it, or DDP
    # fails on parameters that require grad but take no part in the loss.
    ema.requires_grad_(False)
    # timm leaves the copy in eval mode; Lightning switches modes for val/test/predict anyway,
    # and a train-mode copy avoids its "modules in eval mode at the start of training" warning.
    return ema.train()


def check_ema_sharding(strategy: Any, ema: nn.Module | None) -> None:
    """Before FSDP wraps the model: the average is a whole, unsharded copy that its update pairs with the sharded
    parameters by name, which cannot work."""
    from lightning.pytorch.strategies import FSDPStrategy

    if isinstance(strategy, FSDPStrategy) and ema is not None:
        raise UserValueError("optim.ema_decay keeps an unsharded average of the weights, which FSDP's sharded "
                             "parameters cannot update: drop ema_decay under FSDP, or train with ddp")


__all__ = ["PartialEma", "check_ema_sharding", "ema_copy"]
