"""What `vit fit` prints: the model in two lines, a progress bar without Lightning's version number, and
none of the dependencies' advertisements or deprecation notices.

Each filter is narrow (one message, one module) and names the version that made it necessary, so a
new warning from the same place still shows.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelSummary, RichProgressBar
from lightning.pytorch.utilities import rank_zero_info
from torch import nn


class _DropMessages(logging.Filter):
    """Drop log records whose message starts with one of ``prefixes``."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def quiet_dependencies() -> None:
    """Silence the dependency noise a first `vit fit` prints (idempotent)."""
    # Lightning 2.6 advertises its hosted logger on every run that does not use it, says that it keeps our
    # ModelReport instead of its own summary, and that the LR schedule reads the loader's length.
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropMessages) for f in rank_zero.filters):
        rank_zero.addFilter(_DropMessages("💡 Tip: For seamless cloud logging",
                                          "Trainer already configured with model summary callbacks",
                                          "Loading `train_dataloader` to estimate number of stepping batches"))
    # torch 2.10+ deprecates `isinstance(x, LeafSpec)`, which Lightning 2.6's _pytree helper still uses.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            module=r"lightning\.pytorch\.utilities\._pytree")


class ProgressBar(RichProgressBar):
    """Lightning's rich progress bar without ``v_num`` (the logger's version: the run folder says it)."""

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics


class ModelReport(ModelSummary):
    """The model in a line: its class and parameters (trainable and frozen), without copies kept beside it
    (an EMA average is no more parameters of the model) and without Lightning's FLOPs column, which reads 0
    unless the module has an ``example_input_array``."""

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        model = getattr(pl_module, "model", pl_module)
        trainable, frozen = count_parameters(model)
        lines = [f"model: {type(model).__name__} {getattr(pl_module, 'model_name', '')}".rstrip()
                 + f", {trainable + frozen:,} parameters ({trainable:,} trainable, {frozen:,} frozen)"]
        ema = getattr(pl_module, "model_ema", None)
        if isinstance(ema, nn.Module):
            lines.append("  and an EMA copy of its weights (evaluated too; not counted above)")
        rank_zero_info("\n".join(lines))


def count_parameters(module: nn.Module) -> tuple[int, int]:
    """(trainable, frozen) parameter counts of ``module``."""
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in module.parameters()) - trainable
