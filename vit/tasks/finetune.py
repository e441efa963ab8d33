"""Fine-tuning strategies: which parts of a pretrained network train, epoch by epoch, by the roles the network gives
its parameters (`vit.nn.roles`).

    full           everything trains (with layer-wise LR decay, the usual fine-tuning)
    linear_probe   only the head trains: stem, tokens, blocks and pool (SigLIP's attention pool too) are frozen
    partial        the stem, the tokens and positions, and the first ``freeze_blocks`` blocks are frozen
    staged         the head alone for ``head_epochs`` epochs, then everything, with its own warm-up

Freezing is a function of the epoch alone, re-applied at every training step: a resumed run freezes
and unfreezes exactly where the uninterrupted run did. A frozen parameter keeps ``requires_grad``
off (no gradient, no update, no weight decay) but stays in its optimiser group, so the groups never
change. Frozen modules also run in eval mode (no dropout or stochastic depth in features that do not
train). Under DDP, parameters that come and go need ``find_unused_parameters``; the task checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from vit.errors import UserValueError
from vit.nn.roles import ParamRoles

STRATEGIES = ("full", "linear_probe", "partial", "staged")


def check_strategy(finetune: str, freeze_blocks: int, head_epochs: int, depth: int) -> None:
    """A clear error for a strategy name or setting that cannot work."""
    if finetune not in STRATEGIES:
        raise UserValueError(f"model.finetune must be one of {STRATEGIES}, got {finetune!r}")
    if finetune == "partial" and not 0 < freeze_blocks <= depth:
        raise UserValueError(f"finetune: partial needs 0 < freeze_blocks <= depth ({depth}), got {freeze_blocks}")
    if finetune == "staged" and head_epochs < 1:
        raise UserValueError(f"finetune: staged needs head_epochs >= 1, got {head_epochs}")


@dataclass(frozen=True)
class Frozen:
    """What does not train in an epoch: parameters by name, and the modules that hold them (run in eval mode)."""

    names: frozenset[str]
    modules: tuple[nn.Module, ...]


def frozen_parts(network: nn.Module, roles: ParamRoles, finetune: str, freeze_blocks: int, head_epochs: int,
                 epoch: int) -> Frozen:
    """What does not train in ``epoch`` under the strategy: all but the head (``linear_probe``, and ``staged``
    before ``head_epochs``), or the stem, tokens and first ``freeze_blocks`` blocks (``partial``)."""
    if finetune == "linear_probe" or (finetune == "staged" and epoch < head_epochs):
        parts, blocks = ("stem", "tokens", "blocks", "pool"), None
    elif finetune == "partial":
        parts, blocks = ("stem", "tokens", "blocks"), freeze_blocks
    else:
        return Frozen(frozenset(), ())
    return Frozen(frozenset(roles.names(network, *parts, blocks=blocks)),
                  tuple(roles.modules(network, *parts, blocks=blocks)))


def apply_freezing(network: nn.Module, frozen: Frozen) -> None:
    """Turn gradients off (and eval mode on) for what is ``frozen``, and gradients on for the rest."""
    for name, p in network.named_parameters():
        p.requires_grad_(name not in frozen.names)
    for module in frozen.modules:
        module.eval()


def unfreeze_epoch(finetune: str, head_epochs: int) -> int | None:
    """The epoch where a staged fine-tuning starts training the backbone (its warm-up starts again)."""
    return head_epochs if finetune == "staged" else None


__all__ = ["STRATEGIES", "Frozen", "apply_freezing", "check_strategy", "frozen_parts", "unfreeze_epoch"]
