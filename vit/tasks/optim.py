"""How the tasks optimise: the classifier's settings (`Optimization`), AdamW parameter groups with layer decay and
the one no-decay rule (both from the network's `vit.nn.roles`), and the lr schedules, stepped and resumed alike by
every task (`step_schedule`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vit.errors import UserValueError
from vit.nn.roles import ParamRoles, roles_of, wrapped_name

SCHEDULES = ("cosine", "onecycle")


@dataclass(frozen=True)
class Optimization:
    """How a classifier trains: AdamW, the lr schedule, layer decay and the EMA of the weights. In a config:
    ``model.init_args.optim: {lr: 0.001, warmup_epochs: 5}``; on the command line ``--model.init_args.optim.lr``.

    Args:
        lr: peak learning rate of the last layer group (the head), for a global batch of ``lr_base_batch``.
        lr_base_batch: when set, ``lr`` is scaled linearly to the real global batch (batch size x devices x
            nodes x gradient accumulation), as fine-tuning recipes quote it; ``None`` uses ``lr`` as given.
        weight_decay: AdamW decoupled weight decay (not on biases, norms, tokens and positions).
        betas: AdamW betas.
        warmup_epochs: linear warm-up length in epochs (fractions allowed).
        warmup_steps: warm-up length in optimiser steps; overrides ``warmup_epochs`` when set.
        min_lr: the cosine schedule's floor for the head group.
        schedule: "cosine": linear warm-up, then cosine down to ``min_lr`` (every published recipe here).
            "onecycle": torch's ``OneCycleLR``, as plain PyTorch loops often use it: cosine warm-up from
            lr/25, cosine down to lr/25e4, and AdamW's beta1 cycled 0.95 -> 0.85 -> 0.95 against the lr
            (``betas[0]`` and ``min_lr`` unused). From scratch on small folders it trains better in the same
            steps (scripts/experiments/parity.py). Not with ``finetune: Staged``.
        layer_decay: layer-wise lr decay factor (e.g. 0.75 for fine-tuning); ``None`` = off.
        ema_decay: decay of timm's ``ModelEmaV3`` (warmed up over the first steps); ``None`` = no EMA.
            Validation and test use it.
    """

    lr: float = 1e-3
    lr_base_batch: int | None = None
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_epochs: float = 0.0
    warmup_steps: int | None = None
    min_lr: float = 1e-6
    schedule: str = "cosine"
    layer_decay: float | None = None
    ema_decay: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "betas", tuple(self.betas))  # a config's list
        if self.schedule not in SCHEDULES:
            raise UserValueError(f"optim.schedule must be 'cosine' or 'onecycle', got {self.schedule!r}")


def param_groups(
    model: nn.Module, lr: float, weight_decay: float, layer_decay: float | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None, roles: ParamRoles | None = None,
) -> list[dict[str, Any]]:
    """AdamW parameter groups from the network's roles (``roles``, else what ``model`` says: `vit.nn.roles`): the
    one no-decay rule (`ParamRoles.decays`), a peak lr per layer with layer decay, and the head apart.

    Every parameter is in a group, frozen or not: freezing (see `vit.tasks.finetune`) only stops its
    gradient, so the groups never change and a resumed run's optimiser state always fits. Each group's
    ``lr`` is set directly (``lr * layer_decay ** (depth + 1 - layer)``) because Lightning's scheduler
    stepping knows nothing of timm's ``lr_scale`` key. Group names: ``layer{i}_decay``,
    ``layer{i}_no_decay`` (or ``decay``/``no_decay`` without layer decay), ``head_decay``, ``head_no_decay``.
    ``shapes``: each parameter's shape before FSDP wrapped the model (``use_orig_params`` leaves
    flat 1-D shards, which would all look like biases).
    """
    roles = roles or roles_of(model)
    depth = roles.depth
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, p in model.named_parameters():
        name = wrapped_name(name)
        no_decay = not roles.decays(name, p.ndim if shapes is None else len(shapes[name]))
        layer = roles.layer(name) if layer_decay is not None else depth + 1
        head = roles.role(name) == "head"  # DeiT's second head is a head too
        scale = layer_decay ** (depth + 1 - layer) if layer_decay is not None else 1.0
        key = (depth + 2 if head else layer, no_decay)  # the head sorts last, after the final norm
        if key not in groups:
            prefix = "head_" if head else f"layer{layer}_" if layer_decay is not None else ""
            groups[key] = {
                "params": [], "lr": lr * scale, "weight_decay": 0.0 if no_decay else weight_decay,
                "name": prefix + ("no_decay" if no_decay else "decay"),
            }
        groups[key]["params"].append(p)
    return [groups[k] for k in sorted(groups)]


def merge_groups(*grouped: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parameter groups of several networks (MAE's encoder and decoder), those of the same name joined in order."""
    merged: dict[str, dict[str, Any]] = {}
    for groups in grouped:
        for group in groups:
            if group["name"] in merged:
                merged[group["name"]]["params"] += group["params"]
            else:
                merged[group["name"]] = {**group, "params": list(group["params"])}
    return list(merged.values())


def adamw(groups: list[dict[str, Any]], *, lr: float, betas: tuple[float, float], eps: float = 1e-8
          ) -> torch.optim.AdamW:
    """torch's AdamW over ``groups``, fused (one kernel per tensor for the whole update) wherever every parameter
    is on a CPU or a CUDA device. On a CPU torch's default is a per-tensor loop, several times slower (docs/speed.md,
    "choices measured"); elsewhere (MPS, XLA) torch picks its own implementation."""
    params = [p for group in groups for p in group["params"]]
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up from ~0 to 1, then cosine down to ``min_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def group_schedules(groups: list[dict[str, Any]], warmup: int, total: int, min_ratio: float, start: int | None
                    ) -> list[Callable[[int], float]]:
    """Each group's lr multiplier of the step: warm-up + cosine over the fit; where the head trains alone first
    (``start``: the step the rest begins training), the other groups stay at 0 until then and warm up again."""
    schedule = lambda step: warmup_cosine(step, warmup, total, min_ratio)
    if start is None:
        return [schedule] * len(groups)
    rest = lambda step: warmup_cosine(step - start, warmup, total - start, min_ratio) if step >= start else 0.0
    return [schedule if g["name"].startswith("head_") else rest for g in groups]


class _ThisRunsSchedule:
    """Mixed into a torch lr scheduler: a checkpoint's state gives it the step reached, and the lr of that step
    comes from this run's schedule, whose length (``planned``: the attributes that hold it) is kept.

    A finished run resumed for more epochs (``--trainer.max_epochs 60 --ckpt_path last`` after 40) has a longer
    schedule than the one saved: torch (2.14) restores OneCycleLR's ``total_steps``, so it stopped one step past
    the old end ("Tried to step 721 times. The specified number of total steps is 720"), and the first step after
    the resume trained at the old schedule's final lr. Where the length is unchanged, nothing changes: the lr set
    here is the one the saved step() had set.
    """

    planned: tuple[str, ...] = ()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        kept = {key: self.__dict__[key] for key in self.planned}
        super().load_state_dict(state_dict)  # type: ignore[misc]
        self.__dict__.update(kept)
        with warnings.catch_warnings():  # get_lr() outside step() warns; here it is what step() would have set
            warnings.simplefilter("ignore", UserWarning)
            lrs = self.get_lr()  # type: ignore[attr-defined]
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):  # type: ignore[attr-defined]
            group["lr"] = lr
        self._last_lr = list(lrs)


class LambdaLR(_ThisRunsSchedule, torch.optim.lr_scheduler.LambdaLR):
    """torch's LambdaLR (its functions are not saved: they are this run's), resuming at this run's lr."""


class OneCycleLR(_ThisRunsSchedule, torch.optim.lr_scheduler.OneCycleLR):
    """torch's OneCycleLR, resuming at the saved step of this run's cycle, whatever the saved run's length."""

    planned = ("total_steps", "_schedule_phases")


def one_cycle(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """`OneCycleLR` peaking at each group's own ``lr`` (layer decay kept), for ``total_steps`` >= 3.

    Each phase needs 2+ steps (torch divides by its length - 1), so the warm-up is clamped to [2, total - 1].
    """
    up = min(max(2, warmup_steps), total_steps - 1)
    return OneCycleLR(
        optimizer, max_lr=[g["lr"] for g in optimizer.param_groups], total_steps=total_steps,
        pct_start=up / total_steps,
    )


def step_schedule(
    optimizer: torch.optim.Optimizer,
    schedule: Callable[[int], float] | Sequence[Callable[[int], float]] | torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """What every task's ``configure_optimizers`` returns: the optimiser and its lr schedule, stepped at every
    optimiser step. A multiplier of the step (or one per group) becomes the resume-safe `LambdaLR`."""
    if not isinstance(schedule, torch.optim.lr_scheduler.LRScheduler):
        schedule = LambdaLR(optimizer, schedule)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def global_batch(trainer: Any) -> tuple[int, str]:
    """Images per optimiser step across every process, and how they add up (for the lr's scaling report)."""
    batch = getattr(trainer.datamodule, "batch_size", None)
    if batch is None:  # loaders passed to fit(): configure_optimizers runs before Lightning loads them, unless asked
        trainer.fit_loop.setup_data()  # as Trainer.estimated_stepping_batches does; later calls reuse the loader
        batch = trainer.train_dataloader.batch_size
    world, accumulate = trainer.world_size, trainer.accumulate_grad_batches
    return batch * world * accumulate, (f"{batch} per process x {world} processes ({trainer.num_nodes} nodes x "
                                        f"{trainer.num_devices} devices) x {accumulate} accumulated")


def network_group_table(network: nn.Module, optimizer: torch.optim.Optimizer, frozen_names: Collection[str],
                        shapes: Mapping[str, tuple[int, ...]]) -> str:
    """`describe_param_groups` for a network's optimiser: what ``frozen_names`` names does not train, and each
    parameter counts whole, by its shape in ``shapes`` (under FSDP a rank holds a flat shard of it)."""
    params = list(network.named_parameters())
    sizes = {id(p): math.prod(shapes[wrapped_name(name)]) for name, p in params if wrapped_name(name) in shapes}
    return describe_param_groups(optimizer, [p for name, p in params if name in frozen_names], sizes)


def per_epoch_steps(trainer: Any, total: int) -> int:
    """Optimiser steps in one epoch (``total`` when the epoch length is unknown)."""
    batches = trainer.num_training_batches
    return total if math.isinf(batches) else math.ceil(batches / trainer.accumulate_grad_batches)


def describe_param_groups(optimizer: torch.optim.Optimizer, frozen: Iterable[torch.Tensor] = (),
                          sizes: Mapping[int, int] | None = None) -> str:
    """A table of the optimiser's groups: name, parameters, peak lr, weight decay, and whether they train.
    ``sizes``: each parameter's whole size by ``id`` where that is not its own (FSDP: a rank holds a shard)."""
    frozen_ids, sizes = {id(p) for p in frozen}, sizes or {}
    lines = [f"{'parameter group':<20} {'params':>11} {'peak lr':>10} {'weight decay':>13}  trains now"]
    for group in optimizer.param_groups:
        n = sum(sizes.get(id(p), p.numel()) for p in group["params"])
        trains = "no" if all(id(p) in frozen_ids for p in group["params"]) else "yes"
        # OneCycleLR starts at max_lr / 25 ("initial_lr" is that start) and keeps the peak as "max_lr";
        # the other schedules here start from the peak, which LRScheduler saves as "initial_lr".
        peak = group.get("max_lr", group.get("initial_lr", group["lr"]))
        lines.append(f"{group.get('name', '?'):<20} {n:>11,} {peak:>10.3g} {group['weight_decay']:>13g}  {trains}")
    return "\n".join(lines)
