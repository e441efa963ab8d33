"""Fine-tuning strategies: which parts of a pretrained network train, epoch by epoch, by the roles the network gives
its parameters (`vit.nn.roles`). A strategy is a part of the classifier, picked in its config by class as the head
and the optimisation are (``model.init_args.finetune``):

    Full                              everything trains (with layer-wise LR decay, the usual fine-tuning)
    LinearProbe                       only the head trains: stem, tokens, blocks and pool (SigLIP's attention pool
                                      too) are frozen
    Partial(freeze_blocks=4)          the stem, the tokens and positions, and the first 4 blocks are frozen
    Staged(head_epochs=2)             the head alone for 2 epochs, then everything, with its own warm-up
    Adapters(rank=8, dora=False, ...) the base stays frozen; low-rank adapters (`vit.nn.lora`) and the head train,
                                      the norms and prefix tokens too if asked; with ``head_epochs`` the head first

    finetune:
      class_path: vit.tasks.finetune.Adapters
      init_args: {rank: 16, alpha: 32.0, targets: [q, k, v, proj, fc1, fc2], head_epochs: 1}

A strategy answers what the task asks of it: what is frozen in an epoch (`FineTuning.frozen`), the epoch the rest
starts training (`unfreeze_epoch`, where its lr warms up again), whether parameters go without gradients once DDP
has wrapped the model (`unused_parameters`), and, for adapters, the network's set-up (`attach`), the pretrained
base's loading, the optimiser's groups, the FSDP check and the checkpoint's thin save and load; the other strategies
answer those as no-ops. A new strategy is a new subclass; the task does not change.

Freezing is a function of the epoch alone, re-applied at every training step: a resumed run freezes and unfreezes
exactly where the uninterrupted run did. A frozen parameter keeps ``requires_grad`` off (no gradient, no update, no
weight decay) but stays in its optimiser group, so the groups never change. Frozen modules also run in eval mode (no
dropout or stochastic depth in features that do not train). The old spellings (``finetune: lora`` with ``lora:``,
``freeze_blocks``, ``head_epochs``) are read by `vit.tasks.compat`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from vit._graveyard import moved_name
from vit.checkpoints.lora import STATE_PREFIXES, base_identity, completed, describe_base, held_names
from vit.checkpoints.meta import META_KEY
from vit.checkpoints.weights import load_base
from vit.errors import UserValueError
from vit.nn.lora import LoraConfig, add_adapters, base_digest, base_layers, init_magnitudes, is_adapter
from vit.nn.roles import ParamRoles, wrapped_name
from vit.nn.vision import VisionTransformer

Loader = Callable[[nn.Module, str], Any]  # a backbone's load_pretrained(network, source)


@dataclass(frozen=True)
class Frozen:
    """What does not train in an epoch: parameters by name, and the modules that hold them (run in eval mode)."""

    names: frozenset[str]
    modules: tuple[nn.Module, ...]


NOTHING = Frozen(frozenset(), ())


class FineTuning:
    """What trains, epoch by epoch. Subclasses are dataclasses of their settings; the base trains everything."""

    picked_by_class: ClassVar[bool] = True  # a config names the class (`vit.tasks.base.as_config`)
    trained: frozenset[str] | None = None  # the names that train for good (adapters); None: freezing by epoch

    @property
    def name(self) -> str:
        """The strategy in messages (``finetune: Staged``)."""
        return type(self).__name__

    def check(self, depth: int) -> None:
        """A clear error for settings that cannot work on a network of ``depth`` blocks."""

    def attach(self, network: nn.Module, roles: ParamRoles) -> None:
        """Set the network up for the strategy, before any weight is loaded (adapters: on the network)."""

    def frozen(self, network: nn.Module, roles: ParamRoles, epoch: int) -> Frozen:
        """What does not train in ``epoch``."""
        return NOTHING

    def unfreeze_epoch(self) -> int | None:
        """The epoch where the rest starts training after the head alone (its lr warms up again), or None."""
        return None

    @property
    def unused_parameters(self) -> bool:
        """Whether parameters go without gradients after DDP wrapped the model (``find_unused_parameters``)."""
        return False

    def check_ddp(self, model: nn.Module) -> None:
        """At fit start: a DDP-wrapped ``model`` must find unused parameters where parameters come and go."""
        if self.unused_parameters and isinstance(model, DistributedDataParallel) and not model.find_unused_parameters:
            raise UserValueError(f"finetune: {self.name} freezes parameters, which DDP only allows with "
                                 "find_unused_parameters: set trainer.strategy: ddp_find_unused_parameters_true")

    def load_pretrained(self, network: nn.Module, source: str, load: Loader) -> None:
        """The pretrained weights into ``network``."""
        load(network, source)

    def optimizer_groups(self, network: nn.Module, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The optimiser's groups of what may train (all of them: freezing by epoch keeps every group)."""
        return groups

    def check_sharding(self, strategy: Any) -> None:
        """A clear error where the Trainer's ``strategy`` (FSDP, before it wraps the model) cannot shard this."""

    def checkpoint_meta(self, pretrained: str | None, load: Callable[[], None]) -> dict[str, Any]:
        """The strategy's entries in ``checkpoint["vit"]`` (``load``: the task's pretrained loading)."""
        return {}

    def saved_state(self, state_dict: dict[str, Tensor], pretrained: str | None) -> dict[str, Tensor]:
        """The state dict a checkpoint holds."""
        return state_dict

    def restore(self, checkpoint: dict[str, Any], network: nn.Module, configure: Callable[[], None],
                load: Loader) -> bool:
        """Before a checkpoint's state dict is copied: what it needs that it does not hold (``configure``: the
        task's pretrained loading). Whether it loaded the pretrained weights itself."""
        return False

    def base_left_out(self, module: nn.Module, incompatible: Any) -> None:
        """A ``load_state_dict`` post-hook: what a checkpoint may leave out (nothing)."""


@dataclass(frozen=True)
class Full(FineTuning):
    """Everything trains (with ``optim.layer_decay``, the usual fine-tuning)."""


class _Freezing(FineTuning):
    """A strategy that freezes whole roles for some epochs: parameters come and go under DDP."""

    @property
    def unused_parameters(self) -> bool:
        return True


def frozen_roles(network: nn.Module, roles: ParamRoles, *parts: str, blocks: int | None = None) -> Frozen:
    """The parameters and modules of the roles ``parts`` (of blocks, the first ``blocks`` alone; None: all)."""
    return Frozen(frozenset(roles.names(network, *parts, blocks=blocks)),
                  tuple(roles.modules(network, *parts, blocks=blocks)))


BACKBONE = ("stem", "tokens", "blocks", "pool")  # all but the head


@dataclass(frozen=True)
class LinearProbe(_Freezing):
    """Only the head trains: stem, tokens, blocks and pool (SigLIP's attention pool too) stay frozen."""

    def frozen(self, network: nn.Module, roles: ParamRoles, epoch: int) -> Frozen:
        return frozen_roles(network, roles, *BACKBONE)


@dataclass(frozen=True)
class Partial(_Freezing):
    """The stem, the prefix tokens and positions, and the first ``freeze_blocks`` blocks stay frozen."""

    freeze_blocks: int

    def check(self, depth: int) -> None:
        if not 0 < self.freeze_blocks <= depth:
            raise UserValueError(f"finetune: Partial needs 0 < freeze_blocks <= depth ({depth}), got "
                                 f"{self.freeze_blocks}")

    def frozen(self, network: nn.Module, roles: ParamRoles, epoch: int) -> Frozen:
        return frozen_roles(network, roles, "stem", "tokens", "blocks", blocks=self.freeze_blocks)


@dataclass(frozen=True)
class Staged(_Freezing):
    """The head alone for ``head_epochs`` epochs, then everything, the backbone's lr warming up again."""

    head_epochs: int

    def check(self, depth: int) -> None:
        if self.head_epochs < 1:
            raise UserValueError(f"finetune: Staged needs head_epochs >= 1, got {self.head_epochs}")

    def frozen(self, network: nn.Module, roles: ParamRoles, epoch: int) -> Frozen:
        return frozen_roles(network, roles, *BACKBONE) if epoch < self.head_epochs else NOTHING

    def unfreeze_epoch(self) -> int | None:
        return self.head_epochs


def adapter_trained(network: nn.Module, roles: ParamRoles, train_norms: bool, train_tokens: bool) -> frozenset[str]:
    """What trains under adapters (once the head's epochs are over): the adapters, the head, and the norms and
    tokens if asked; all else is the frozen base a checkpoint names but does not hold."""
    norms = {f"{m}.{n}" if m else n for m, module in network.named_modules() if isinstance(module, nn.LayerNorm)
             for n, _ in module.named_parameters(recurse=False)}
    return frozenset(name for name, _ in network.named_parameters() if is_adapter(name)
                     or roles.role(name) == "head" or (train_norms and name in norms)
                     or (train_tokens and roles.role(name) == "tokens"))


@dataclass(eq=False)
class Adapters(FineTuning, LoraConfig):
    """LoRA adapters (DoRA's with ``dora: true``) on a frozen base: the adapters and the head train, the base's
    requires_grad is off for good (DDP never waits for its gradients), the optimiser holds what trains, and
    checkpoints hold what trains and name the base (`vit.checkpoints.lora`).

    Args:
        rank, alpha, dropout, targets, last_blocks, dora: the adapters (`vit.nn.lora.LoraConfig`; targets among q,
            k, v, qkv, proj, fc1, fc2).
        train_norms: the LayerNorms train too; train_tokens: the prefix tokens (cls, registers, distillation) and
            the positions train too.
        save_base: checkpoints hold the whole network (base and adapters: one self-contained file) instead of what
            trains and the base's name and hash.
        head_epochs: epochs that train the head alone before the adapters train (with their own warm-up).

    Loading: the pretrained base under the adapters, DoRA's magnitudes restarted from it, its hash kept. A thin
    checkpoint loads its base as ``pretrained`` found it (or as the checkpoint names it), checks the hash, then
    completes the state dict; FSDP loads the state dict itself, after the wrap: the base loads first, as
    ``pretrained`` (`vit fit --ckpt_path` keeps it), and `base_left_out` forgives its missing keys.
    """

    train_norms: bool = False
    train_tokens: bool = False
    save_base: bool = False
    head_epochs: int = 0

    # The run's state, not settings (so no dataclass fields): set by `attach` and by loading the base.
    base = None  # the frozen base's identity (`base_identity`), once loaded
    network_names = frozenset()  # the network's state-dict names, adapters included

    @property
    def name(self) -> str:
        return f"Adapters ({'DoRA' if self.dora else 'LoRA'})"

    def config(self) -> LoraConfig:
        """The adapters' own settings (`vit.nn.lora`): this strategy's fields that `LoraConfig` has."""
        return LoraConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LoraConfig)})

    def check(self, depth: int) -> None:
        if self.head_epochs < 0:
            raise UserValueError(f"finetune: Adapters' head_epochs must be >= 0, got {self.head_epochs}")

    def attach(self, network: nn.Module, roles: ParamRoles) -> None:
        if not isinstance(network, VisionTransformer):
            raise UserValueError(f"finetune: Adapters adapts our ViTs' linear layers; this backbone builds a "
                                 f"{type(network).__name__}: use finetune: Full or LinearProbe")
        add_adapters(network, self.config())
        self.trained = adapter_trained(network, roles, self.train_norms, self.train_tokens)
        self.network_names = frozenset(network.state_dict())  # the names of a checkpoint that holds the base
        for name, p in network.named_parameters():
            p.requires_grad_(name in self.trained)

    def frozen(self, network: nn.Module, roles: ParamRoles, epoch: int) -> Frozen:
        if epoch < self.head_epochs:
            return frozen_roles(network, roles, *BACKBONE)
        # ``trained`` holds plain names; FSDP's wrapped blocks rename
        return Frozen(frozenset(n for n, _ in network.named_parameters() if wrapped_name(n) not in self.trained), ())

    def unfreeze_epoch(self) -> int | None:
        return self.head_epochs if self.head_epochs > 0 else None

    @property
    def unused_parameters(self) -> bool:
        return self.head_epochs > 0  # the base is frozen before the wrap; only the head's epochs come and go

    def load_pretrained(self, network: nn.Module, source: str, load: Loader) -> None:
        """The pretrained base under the adapters, DoRA's magnitudes restarted from it, and its hash."""
        with base_layers(network):
            load(network, source)
        init_magnitudes(network)
        self.base = base_identity(source, base_digest(network.state_dict(), self.trained))

    def optimizer_groups(self, network: nn.Module, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Without the frozen base, and without the groups that empties."""
        # by the plain name: under FSDP (configure_optimizers runs after the wrap) a block's names gain segments
        keep = {id(p) for n, p in network.named_parameters() if wrapped_name(n) in self.trained}
        groups = [{**g, "params": [p for p in g["params"] if id(p) in keep]} for g in groups]
        return [g for g in groups if g["params"]]

    def check_sharding(self, strategy: Any) -> None:
        """Each block holds frozen base weights beside trained adapters, which torch's FSDP (2.14) shards only with
        ``use_orig_params=True``; Lightning 2.6's FSDPStrategy sets it unless told otherwise, and without it torch
        refuses the block with a list of every parameter."""
        from lightning.pytorch.strategies import FSDPStrategy

        if isinstance(strategy, FSDPStrategy) and not strategy.kwargs.get("use_orig_params"):
            raise UserValueError(f"finetune: {self.name} freezes the base inside every block, which FSDP shards only "
                                 "with use_orig_params: drop trainer.strategy's use_orig_params: false (Lightning's "
                                 "default is true)")

    def thin(self, pretrained: str | None) -> bool:
        """Whether checkpoints leave the base out: one that can be found again (``pretrained``, or a resumed
        checkpoint's), without ``save_base``."""
        return (self.base is not None or bool(pretrained)) and not self.save_base

    def checkpoint_meta(self, pretrained: str | None, load: Callable[[], None]) -> dict[str, Any]:
        """``checkpoint["vit"]["lora"]``: the adapters' settings and the base's identity (None: held in full)."""
        if self.thin(pretrained) and self.base is None:
            load()  # a checkpoint saved before any fit: the base's hash needs the base
        base = self.base if self.thin(pretrained) else None
        return {"lora": {**self.config().to_dict(), "train_norms": self.train_norms,
                         "train_tokens": self.train_tokens, "save_base": not self.thin(pretrained), "base": base}}

    def saved_state(self, state_dict: dict[str, Tensor], pretrained: str | None) -> dict[str, Tensor]:
        return held_names(state_dict, self.trained) if self.thin(pretrained) else state_dict

    def restore(self, checkpoint: dict[str, Any], network: nn.Module, configure: Callable[[], None],
                load: Loader) -> bool:
        """A thin checkpoint: its base loaded as ``pretrained`` says (``configure``), else as the checkpoint names it,
        its hash checked, then the state dict completed with it. FSDP loads the state dict itself: loaded already."""
        base = (checkpoint[META_KEY].get("lora") or {}).get("base")
        if base is None or "state_dict" not in checkpoint:
            return False
        configure()
        loaded_here = self.base is None
        if loaded_here:
            load_base(network, base, self.trained, "the checkpoint", load)
            self.base = dict(base)
        elif self.base["sha256"] != base["sha256"]:
            raise UserValueError(f"the checkpoint's adapters were trained on {describe_base(base)}; pretrained: "
                                 f"{self.base['source']} holds other weights (sha256 {self.base['sha256'][:16]}…)"
                                 ": give the base it was trained on")
        # the network's entries, and its EMA's where the checkpoint has one (PartialEma shares the base's tensors)
        ema = any(k.startswith(STATE_PREFIXES[1]) for k in checkpoint["state_dict"])
        prefixes = STATE_PREFIXES if ema else STATE_PREFIXES[:1]
        checkpoint["state_dict"] = completed(checkpoint["state_dict"], network.state_dict(), prefixes)
        rank_zero_info(f"adapters on {describe_base(base)}")
        return loaded_here

    def base_left_out(self, module: nn.Module, incompatible: Any) -> None:
        """A thin checkpoint's missing base is no mismatch once the base is in. FSDP loads a checkpoint's state dict
        itself, after sharding and before on_load_checkpoint could complete it; the base must then be in already,
        loaded before the wrap by the task's ``configure_model``."""
        frozen = {prefix + name for prefix in STATE_PREFIXES for name in self.network_names - self.trained}
        left_out = [k for k in incompatible.missing_keys if wrapped_name(k) in frozen]
        if left_out and self.base is None:
            raise UserValueError("the checkpoint holds LoRA adapters alone, and their base was not loaded before "
                                 "them (under FSDP: before the model is sharded): set model.init_args.pretrained to "
                                 "the base the checkpoint names (vit fit --ckpt_path does, where the file is)")
        for key in left_out:
            incompatible.missing_keys.remove(key)


def apply_freezing(network: nn.Module, frozen: Frozen) -> None:
    """Turn gradients off (and eval mode on) for what is ``frozen``, and gradients on for the rest."""
    for name, p in network.named_parameters():
        p.requires_grad_(name not in frozen.names)
    for module in frozen.modules:
        module.eval()


__all__ = ["Adapters", "FineTuning", "Frozen", "Full", "LinearProbe", "Partial", "Staged", "adapter_trained",
           "apply_freezing"]


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # 0.1's LoraOptions, STRATEGIES, check_strategy, ... (vit/_graveyard.py)
