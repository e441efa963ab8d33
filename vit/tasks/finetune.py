"""Fine-tuning strategies: which parts of a pretrained network train, epoch by epoch, by the roles the network gives
its parameters (`vit.nn.roles`).

    full           everything trains (with layer-wise LR decay, the usual fine-tuning)
    linear_probe   only the head trains: stem, tokens, blocks and pool (SigLIP's attention pool too) are frozen
    partial        the stem, the tokens and positions, and the first ``freeze_blocks`` blocks are frozen
    staged         the head alone for ``head_epochs`` epochs, then everything, with its own warm-up
    lora, dora     the base stays frozen; low-rank adapters (`vit.nn.lora`) and the head train, the norms and the
                   prefix tokens too if asked (`LoraOptions`); with ``head_epochs`` the head trains alone first

Freezing is a function of the epoch alone, re-applied at every training step: a resumed run freezes
and unfreezes exactly where the uninterrupted run did. A frozen parameter keeps ``requires_grad``
off (no gradient, no update, no weight decay) but stays in its optimiser group, so the groups never
change. Frozen modules also run in eval mode (no dropout or stochastic depth in features that do not
train). Under DDP, parameters that come and go need ``find_unused_parameters``; the task checks it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from vit.errors import UserValueError
from vit.nn.lora import LoraConfig, is_adapter
from vit.nn.roles import ParamRoles, wrapped_name

STRATEGIES = ("full", "linear_probe", "partial", "staged", "lora", "dora")
ADAPTERS = ("lora", "dora")


@dataclass(frozen=True)
class LoraOptions:
    """``finetune: lora | dora``'s settings, one argument of the task (``lora: {rank: 16, targets: [q, v]}``).

    rank, alpha, dropout, targets, last_blocks: the adapters (`vit.nn.lora.LoraConfig`; targets among q, k, v,
    qkv, proj, fc1, fc2). train_norms: the LayerNorms train too; train_tokens: the prefix tokens (cls, registers,
    distillation) and the positions train too. save_base: checkpoints hold the whole network (base and
    adapters: one self-contained file) instead of what trains and the base's name and hash.
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: Sequence[str] = ("q", "v")
    last_blocks: int | None = None
    train_norms: bool = False
    train_tokens: bool = False
    save_base: bool = False

    def config(self, dora: bool) -> LoraConfig:
        """The adapters' config (`vit.nn.lora`)."""
        return LoraConfig(self.rank, self.alpha, self.dropout, tuple(self.targets), self.last_blocks, dora)


def check_strategy(finetune: str, freeze_blocks: int, head_epochs: int, depth: int, lora: object = None) -> None:
    """A clear error for a strategy name or setting that cannot work."""
    if lora is not None and finetune not in ADAPTERS:
        raise UserValueError(f"model.lora sets adapters, which finetune: {finetune} does not train: use finetune: "
                             "lora or dora, or leave lora out")
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


def adapter_trained(network: nn.Module, roles: ParamRoles, options: LoraOptions) -> frozenset[str]:
    """What trains under ``finetune: lora | dora`` (once the head's epochs are over): the adapters, the head, and
    the norms and tokens if asked; all else is the frozen base a checkpoint names but does not hold."""
    norms = {f"{m}.{n}" if m else n for m, module in network.named_modules() if isinstance(module, nn.LayerNorm)
             for n, _ in module.named_parameters(recurse=False)}
    return frozenset(name for name, _ in network.named_parameters() if is_adapter(name)
                     or roles.role(name) == "head" or (options.train_norms and name in norms)
                     or (options.train_tokens and roles.role(name) == "tokens"))


def frozen_parts(network: nn.Module, roles: ParamRoles, finetune: str, freeze_blocks: int, head_epochs: int,
                 epoch: int, trained: frozenset[str] = frozenset()) -> Frozen:
    """What does not train in ``epoch`` under the strategy: all but the head (``linear_probe``, and ``staged``
    or adapters before ``head_epochs``), the stem, tokens and first ``freeze_blocks`` blocks (``partial``), or all
    but ``trained`` (adapters: `adapter_trained`)."""
    if finetune in ADAPTERS and epoch >= head_epochs:  # ``trained`` holds plain names; FSDP's wrapped blocks rename
        return Frozen(frozenset(n for n, _ in network.named_parameters() if wrapped_name(n) not in trained), ())
    if finetune in ("linear_probe", *ADAPTERS) or (finetune == "staged" and epoch < head_epochs):
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
    return head_epochs if finetune == "staged" or (finetune in ADAPTERS and head_epochs > 0) else None


__all__ = ["ADAPTERS", "STRATEGIES", "Frozen", "LoraOptions", "adapter_trained", "apply_freezing",
           "check_strategy", "frozen_parts", "unfreeze_epoch"]
