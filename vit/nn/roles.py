"""Which parameters of a network play which role: what its optimiser, layer decay, fine-tuning modes, MAE and the
feature cache ask of it, so that none of them keeps a list of names of its own (timm's ``group_matcher`` in spirit).

    stem     what turns pixels into tokens (ViT: patch_embed, norm_pre)            layer 0
    tokens   learned tokens and positions (cls, dist, registers, pos_embed)         layer 0
    blocks   one entry per block, in order (ViT: blocks.i)                          layer i + 1
    pool     what reads the last block for the head (norm, attn_pool, fc_norm)      layer depth + 1
    head     the classifier(s) (head, head_dist)                                    apart, after the rest
    no_decay besides biases and norms (every tensor of one dimension): the tokens and positions

Entries are names of parameters or of the modules that hold them (``blocks.3`` holds ``blocks.3.attn.qkv.weight``).
A parameter in no role (a network that names none: a plain ``nn.Module``) sits with the pool, after the blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

ROLES = ("stem", "tokens", "blocks", "pool", "head")


def held_by(name: str, entry: str) -> bool:
    """Whether the parameter ``name`` is ``entry`` or lies inside the module ``entry``."""
    return name == entry or name.startswith(entry + ".")


def wrapped_name(name: str) -> str:
    """A parameter's name without the segments FSDP and activation checkpointing insert when they wrap a block."""
    return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


@dataclass(frozen=True)
class ParamRoles:
    """The parameters of a network by role (see the module docstring); ``blocks`` holds one tuple per block."""

    stem: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()
    blocks: tuple[tuple[str, ...], ...] = ()
    pool: tuple[str, ...] = ()
    head: tuple[str, ...] = ()
    no_decay: tuple[str, ...] = ()

    @property
    def depth(self) -> int:
        """How many blocks the network has."""
        return len(self.blocks)

    def role(self, name: str) -> str:
        """The role of parameter ``name`` (FSDP's wrapped names too): one of `ROLES`; "pool" when none claims it."""
        name = wrapped_name(name)
        for role in ("stem", "tokens", "head", "pool"):
            if any(held_by(name, entry) for entry in getattr(self, role)):
                return role
        return "blocks" if self.block(name) is not None else "pool"

    def block(self, name: str) -> int | None:
        """The index of the block that holds parameter ``name``, or None."""
        name = wrapped_name(name)
        return next((i for i, entries in enumerate(self.blocks) if any(held_by(name, e) for e in entries)), None)

    def layer(self, name: str) -> int:
        """The layer of layer-wise lr decay: stem and tokens 0, block i -> i + 1, the pool and head depth + 1."""
        role = self.role(name)
        if role in ("stem", "tokens"):
            return 0
        return self.block(name) + 1 if role == "blocks" else self.depth + 1  # type: ignore[operator]

    def decays(self, name: str, ndim: int) -> bool:
        """The one no-decay rule: AdamW decays neither a tensor of one dimension (biases, norms, scales) nor the
        tokens and positions (``no_decay``)."""
        return ndim > 1 and not any(held_by(wrapped_name(name), entry) for entry in self.no_decay)

    def entries(self, *roles: str, blocks: int | None = None) -> list[str]:
        """The entries of ``roles``; with "blocks", only the first ``blocks`` of them when given."""
        found: list[str] = []
        for role in roles:
            if role == "blocks":
                found += [e for entries in self.blocks[:blocks] for e in entries]
            else:
                found += list(getattr(self, role))
        return found

    def names(self, network: nn.Module, *roles: str, blocks: int | None = None) -> list[str]:
        """The names of ``network``'s parameters in ``roles``; of only the first ``blocks`` blocks when given."""
        return [n for n, _ in network.named_parameters() if self.role(n) in roles and (
            blocks is None or self.role(n) != "blocks" or self.block(n) < blocks)]  # type: ignore[operator]

    def modules(self, network: nn.Module, *roles: str, blocks: int | None = None) -> list[nn.Module]:
        """The submodules of ``network`` that ``roles`` name (a token or position is a parameter: none)."""
        named = dict(network.named_modules())
        return [named[e] for e in self.entries(*roles, blocks=blocks) if e in named]


def roles_of(network: nn.Module) -> ParamRoles:
    """What ``network`` says of its parameters (``param_roles()``), or, for one that says nothing, timm's
    ``no_weight_decay()`` set alone (everything else then sits with the pool)."""
    if hasattr(network, "param_roles"):
        return network.param_roles()
    skip: Iterable[str] = network.no_weight_decay() if hasattr(network, "no_weight_decay") else ()
    return ParamRoles(no_decay=tuple(skip))


__all__ = ["ROLES", "ParamRoles", "held_by", "roles_of", "wrapped_name"]
