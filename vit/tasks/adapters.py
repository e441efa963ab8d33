"""What ``finetune: lora | dora`` adds to the classification task: adapters on the network, a frozen base outside
the optimiser, an EMA of what trains, and checkpoints that hold what trains and name the base
(`vit.checkpoints.lora`).

    configure_models   add_adapters (`vit.nn.lora`); the base's requires_grad off for good, so DDP never waits
                       for its gradients (``find_unused_parameters`` is needed only when the head trains alone first)
    configure_model    the pretrained base loaded under the adapters, DoRA's magnitudes restarted from it, its hash
    save               the state dict without the base; ``checkpoint["vit"]["lora"]``: settings, base identity
    load               the base as ``pretrained`` found it, its hash checked, then the state dict completed; FSDP
                       loads the state dict itself, after the wrap: the base loads first, as ``pretrained``
                       (`vit fit --ckpt_path` keeps it), and a hook forgives its missing keys
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from timm.utils import ModelEmaV3
from torch import nn

from vit.checkpoints.lora import STATE_PREFIXES, base_identity, completed, describe_base, held_names
from vit.checkpoints.meta import META_KEY
from vit.checkpoints.weights import load_base
from vit.errors import UserValueError
from vit.nn.lora import add_adapters, base_digest, base_layers, init_magnitudes
from vit.nn.roles import wrapped_name
from vit.nn.vision import VisionTransformer
from vit.tasks.base import from_config
from vit.tasks.finetune import ADAPTERS, LoraOptions, adapter_trained


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


class AdapterTraining:
    """The classifier's adapter fine-tuning (see the module docstring); a no-op for the other strategies."""

    adapter_trained: frozenset[str] | None = None  # the names that train under lora | dora; None: no adapters
    base: dict[str, Any] | None = None  # the frozen base's identity (`base_identity`), once loaded
    network_names: frozenset[str] = frozenset()  # the network's state-dict names, adapters included

    @property
    def lora_options(self) -> LoraOptions:
        """The ``lora`` hyperparameter as settings."""
        return from_config(self.hparams.lora, LoraOptions, LoraOptions())

    def configure_adapters(self) -> None:
        """Adapters on the network and the base frozen for good, under ``finetune: lora | dora``."""
        hp = self.hparams
        if hp.finetune not in ADAPTERS:
            return
        if not isinstance(self.model, VisionTransformer):
            raise UserValueError(f"finetune: {hp.finetune} adapts our ViTs' linear layers; backbone: {hp.backbone} "
                                 f"builds a {type(self.model).__name__}: use finetune: full or linear_probe")
        options = self.lora_options
        add_adapters(self.model, options.config(dora=hp.finetune == "dora"))
        self.adapter_trained = adapter_trained(self.model, self.roles, options)
        self.network_names = frozenset(self.model.state_dict())  # the names of a checkpoint that holds the base
        self.register_load_state_dict_post_hook(self.base_left_out)
        for name, p in self.model.named_parameters():
            p.requires_grad_(name in self.adapter_trained)

    def load_adapted_base(self, source: str) -> None:
        """The pretrained base under the adapters, DoRA's magnitudes restarted from it, and its hash."""
        with base_layers(self.model):
            self.backbone.load_pretrained(self.model, source)
        init_magnitudes(self.model)
        self.base = base_identity(source, base_digest(self.model.state_dict(), self.adapter_trained))

    def trained_groups(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The optimiser's groups without the frozen base (adapters), and without the groups that empties."""
        if self.adapter_trained is None:
            return groups
        # by the plain name: under FSDP (configure_optimizers runs after the wrap) a block's names gain segments
        keep = {id(p) for n, p in self.model.named_parameters() if wrapped_name(n) in self.adapter_trained}
        groups = [{**g, "params": [p for p in g["params"] if id(p) in keep]} for g in groups]
        return [g for g in groups if g["params"]]

    def check_sharding(self) -> None:
        """Before FSDP wraps the model: each block holds frozen base weights beside trained adapters, which torch's
        FSDP (2.14) shards only with ``use_orig_params=True``; Lightning 2.6's FSDPStrategy sets it unless told
        otherwise, and without it torch refuses the block with a list of every parameter."""
        from lightning.pytorch.strategies import FSDPStrategy

        strategy = self.trainer.strategy
        if isinstance(strategy, FSDPStrategy) and self.model_ema is not None:
            # the average is a whole, unsharded copy that its update pairs with the sharded parameters by name
            raise UserValueError("optim.ema_decay keeps an unsharded average of the weights, which FSDP's sharded "
                                 "parameters cannot update: drop ema_decay under FSDP, or train with ddp")
        if self.adapter_trained is not None and isinstance(strategy, FSDPStrategy) and not strategy.kwargs.get(
                "use_orig_params"):
            raise UserValueError(f"finetune: {self.hparams.finetune} freezes the base inside every block, which FSDP "
                                 "shards only with use_orig_params: drop trainer.strategy's use_orig_params: false "
                                 "(Lightning's default is true)")

    def thin(self) -> bool:
        """Whether checkpoints leave the base out: adapters on a base that can be found again (``pretrained``, or
        a resumed checkpoint's), without ``save_base``."""
        known = self.base is not None or bool(self.hparams.pretrained)
        return self.adapter_trained is not None and known and not self.lora_options.save_base

    def adapter_meta(self) -> dict[str, Any]:
        """``checkpoint["vit"]["lora"]``: the adapters' settings and the base's identity (None: held in full)."""
        if self.adapter_trained is None:
            return {}
        options = self.lora_options
        if self.thin() and self.base is None:
            self.configure_model()  # a checkpoint saved before any fit: the base's hash needs the base
        base = self.base if self.thin() else None
        config = options.config(dora=self.hparams.finetune == "dora").to_dict()
        return {"lora": {**config, "train_norms": options.train_norms, "train_tokens": options.train_tokens,
                         "save_base": not self.thin(), "base": base}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.thin():
            checkpoint["state_dict"] = held_names(checkpoint["state_dict"], self.adapter_trained)

    def base_left_out(self, module: nn.Module, incompatible: Any) -> None:
        """A ``load_state_dict`` post-hook: a thin checkpoint's missing base is no mismatch once the base is in. FSDP
        loads a checkpoint's state dict itself, after sharding and before on_load_checkpoint could complete it; the
        base must then be in already, loaded before the wrap by `configure_model`."""
        frozen = {prefix + name for prefix in STATE_PREFIXES for name in self.network_names - self.adapter_trained}
        left_out = [k for k in incompatible.missing_keys if wrapped_name(k) in frozen]
        if left_out and self.base is None:
            raise UserValueError("the checkpoint holds LoRA adapters alone, and their base was not loaded before "
                                 "them (under FSDP: before the model is sharded): set model.init_args.pretrained to "
                                 "the base the checkpoint names (vit fit --ckpt_path does, where the file is)")
        for key in left_out:
            incompatible.missing_keys.remove(key)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A thin checkpoint: the base loaded as ``pretrained`` says, else as the checkpoint names it (loaded without
        ``pretrained``), its hash checked, then the state dict completed. Under FSDP the state dict is in already."""
        super().on_load_checkpoint(checkpoint)
        base = (checkpoint[META_KEY].get("lora") or {}).get("base")
        if base is None or self.adapter_trained is None or "state_dict" not in checkpoint:  # FSDP: loaded already
            return
        self.configure_model()
        if self.base is None:
            load_base(self.model, base, self.adapter_trained, "the checkpoint", self.backbone.load_pretrained)
            self.base, self.pretrained_loaded = dict(base), True
            if self.model_ema is not None:
                self.model_ema.set(self.model)
        elif self.base["sha256"] != base["sha256"]:
            raise UserValueError(f"the checkpoint's adapters were trained on {describe_base(base)}; pretrained: "
                                 f"{self.hparams.pretrained} holds other weights (sha256 {self.base['sha256'][:16]}…)"
                                 ": give the base it was trained on")
        prefixes = STATE_PREFIXES if self.model_ema is not None else STATE_PREFIXES[:1]
        checkpoint["state_dict"] = completed(checkpoint["state_dict"], self.model.state_dict(), prefixes)
        rank_zero_info(f"adapters on {describe_base(base)}")


__all__ = ["AdapterTraining", "PartialEma"]


def ema_copy(model: nn.Module, decay: float | None, trained: frozenset[str] | None = None) -> nn.Module | None:
    """timm's ``ModelEmaV3`` of ``model`` (None without a decay), warmed up: the decay grows with the step
    (1 - (1 + step)^-2/3, capped at ``decay``), so a short run's EMA is not mostly its random initialisation.
    With ``trained`` (adapters), the EMA averages those parameters alone and shares the frozen base's tensors."""
    if decay is None:
        return None
    from timm.utils import ModelEmaV3

    ema = ModelEmaV3(model, decay=decay, use_warmup=True) if trained is None else PartialEma(model, decay, trained)
    # The copy follows the weights by averaging, never by gradients: freeze it, or DDP
    # fails on parameters that require grad but take no part in the loss.
    ema.requires_grad_(False)
    # timm leaves the copy in eval mode; Lightning switches modes for val/test/predict anyway,
    # and a train-mode copy avoids its "modules in eval mode at the start of training" warning.
    return ema.train()
