"""What `vit fit` adds to Lightning's Trainer so that long runs lose nothing and hide nothing.

* `AtomicCheckpointIO`: every checkpoint is written to a temporary file beside its destination,
  fsynced and renamed into place, so a kill at any moment leaves the old file or the new one.
* `BestCheckpoint`: ``best-*.ckpt``, saved when validation produces the monitored value (the weights
  validated); its ``every_n_train_steps`` is the interval of ``last.ckpt``.
* `LastCheckpoint`: ``last.ckpt`` after every epoch, every ``every_n_train_steps`` and when fit ends.
* `RandomState`: keeps the random generators in the checkpoint and puts them back on resume, so a
  run resumed at an epoch boundary continues exactly as the uninterrupted run would have.
* `TrainingReport`: counts and reports what a run worked around: optimiser steps the fp16
  GradScaler skipped, and undecodable images replaced (``skip_bad_images``).
* `StepFloor`: on a small training set, more epochs (up to a cap), so that a from-scratch recipe takes at least
  ``min_steps`` optimiser steps (``step_floor.*``; configs/scratch_small.yaml, configs/multilabel_cpu.yaml).
* `EpochEndResume`: a checkpoint of an epoch's end resumes at the next epoch's start with ``max_steps`` set too.
* `VitTrainer`: Lightning's Trainer with a ``pretrain`` method, so `vit pretrain` is a subcommand of its own.
"""

from __future__ import annotations

import logging
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loops.loop import _Loop
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info

from vit.checkpoints.io import save_checkpoint
from vit.data.protocol import CountsReplacements
from vit.errors import UserValueError

log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint IO, writing through a temporary file in the checkpoint's own folder.

    Lightning (2.6, with fsspec) stages a checkpoint in the system temp folder and moves it; when that
    folder is on another filesystem (a tmpfs /tmp, a data disk, NFS) the move is a copy, and a kill
    during the copy leaves a truncated checkpoint (and a checkpoint-sized file in /tmp's memory).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}")
        save_checkpoint(checkpoint, path)


class BestCheckpoint(ModelCheckpoint):
    """The best checkpoint, best-*.ckpt: saved when validation gives the monitored value, with the weights it scored.

    `vit fit`'s ``checkpoint.*`` (Lightning's ModelCheckpoint). On a step schedule Lightning (2.6)
    saves the weights of that step with the monitor's last logged value, from an earlier validation:
    a "best" checkpoint whose weights were never validated. So ``every_n_train_steps`` is taken here
    and only handed on (`vit fit` links it to `LastCheckpoint`).

    A tie on the monitor goes to the lower ``tie_break`` (val_loss by default): on a small validation split
    accuracy repeats (a 120-image split has 121 values), and Lightning keeps the first of equal scores, which
    kept a texture run's epoch-0 weights (val_acc 0.907, equalled at epoch 21 with a far lower val loss) and
    scored 0.787 on test where epoch 21 scored 0.95. The tie value is part of the callback's state, so a
    resumed run breaks ties as the uninterrupted one does.

    Args:
        every_n_train_steps: rewrite ``last.ckpt`` every this many optimiser steps too (for a mid-epoch
            resume); the best checkpoint still follows validation (by default at the end of every epoch).
        tie_break: the logged value, lower is better, that decides between equal monitored values (None: the
            first stays, as in Lightning). Used with ``save_top_k: 1`` (the default) and when the run logs it.
    """

    def __init__(self, *, every_n_train_steps: int | None = None, tie_break: str | None = "val_loss",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.last_every_n_train_steps = every_n_train_steps
        self.tie_break = tie_break
        self.tie_value: float | None = None  # the kept checkpoint's tie_break value

    def check_monitor_top_k(self, trainer: Trainer, current: torch.Tensor | None = None) -> bool:
        tie = self._tie_value(trainer)
        better = super().check_monitor_top_k(trainer, current)
        if not better and tie is not None and self.best_k_models:
            kept = self.best_k_models[self.kth_best_model_path]
            better = trainer.strategy.reduce_boolean_decision(
                bool(current == kept) and (self.tie_value is None or tie < self.tie_value))
        if better and current is not None:
            self.tie_value = tie
        return better

    def _tie_value(self, trainer: Trainer) -> float | None:
        """This validation's tie_break value, where a tie can be broken by it (a tie on tie_break itself cannot)."""
        if self.save_top_k != 1 or self.tie_break == self.monitor or self.tie_break not in trainer.callback_metrics:
            return None  # (a tie_break of None is in no run's metrics)
        value = float(trainer.callback_metrics[self.tie_break])
        return value if value == value else None  # NaN breaks no tie

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "tie_value": self.tie_value}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.tie_value = state_dict.get("tie_value")  # None in checkpoints written before tie-breaking


class LastCheckpoint(ModelCheckpoint):
    """last.ckpt: rewritten after every epoch, every checkpoint.every_n_train_steps steps, after a validation
    within an epoch (``trainer.val_check_interval``), and when fit ends.

    Whatever the metrics say: this is what ``--ckpt_path last`` resumes from, and a finished run's final
    weights. Lightning's own ``save_last`` (2.6) only saves when a top-k checkpoint is saved at the same
    step, so an epoch without a better metric would leave nothing to resume from; and a step interval
    that does not divide the run (or ``max_steps`` inside an epoch) would leave its last steps in no file.
    Left to decide when to save, ModelCheckpoint saves after validations only once
    ``check_val_every_n_epoch`` is above 1: the MAE recipes validate every 10 or 20 epochs, and a kill lost
    every epoch since the last validation (all of them, before the first).

    A step that ends an epoch is saved at the epoch's end, after validation, not after the batch:
    Lightning (2.6) resumes a checkpoint of an epoch's last batch without starting the next epoch
    (no ``on_train_epoch_start``, no count), so that epoch's own mid-epoch checkpoints resumed as
    finished, and skipped its validation.

    Args:
        dirpath: the checkpoint folder (None: the logger's run folder, as for ModelCheckpoint).
        every_n_train_steps: also rewrite it every this many optimiser steps within an epoch (for a
            mid-epoch resume).
    """

    def __init__(self, dirpath: str | None = None, every_n_train_steps: int | None = None) -> None:
        super().__init__(
            dirpath=dirpath, filename=self.CHECKPOINT_NAME_LAST, monitor=None, save_top_k=1,
            enable_version_counter=False, every_n_train_steps=every_n_train_steps or None,
            save_on_train_epoch_end=True,  # every epoch, validated or not (a validation within one: below)
        )
        self.every_n_train_steps = every_n_train_steps or None
        self.trained = False  # whether this fit trained at all (a resumed, finished run has nothing to do)

    def _save(self, trainer: Trainer) -> None:
        if not trainer.fast_dev_run and trainer.global_step > 0:
            # A full checkpoint, to resume from. Said outright: Lightning 2.6 (2.6.6 here) logs "`weights_only`
            # was not set, defaulting to `False`" at each save that leaves it None; 2.4 took False by default.
            trainer.save_checkpoint(self.format_checkpoint_name({}), weights_only=False)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if batch_idx + 1 < trainer.num_training_batches:  # the last batch's step is saved at the epoch's end
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)  # without a step interval: ModelCheckpoint's epoch save
        if self.every_n_train_steps:
            self._save(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)  # saves nothing: save_on_train_epoch_end
        # a validation within an epoch of fit: its step, as Lightning would save it (the last step: at the epoch's end)
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking and not trainer.is_last_batch:
            self._save(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.trained = True

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Write the final step. (Often the schedule has just written it: one save more, once, keeps this simple.)"""
        super().on_train_end(trainer, pl_module)
        self._save(trainer)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.trained and trainer.ckpt_path:
            rank_zero_info(f"nothing left to train: {trainer.ckpt_path} is the end of this run (epoch "
                           f"{trainer.current_epoch}, step {trainer.global_step}); raise trainer.max_epochs "
                           "(or max_steps) to train on")


# ---- random generators -------------------------------------------------------------------------
class RandomState(Callback):
    """Saves Python's, NumPy's and torch's (CPU and CUDA) generator states with every checkpoint, and
    restores them when a run resumes from one.

    Shuffling, augmentation, dropout and stochastic depth draw from them, and Lightning does not save
    them, so without this a resumed run draws other batches than the uninterrupted run. Under DDP the
    checkpoint holds rank 0's states (gathering every rank's would put a collective in every save):
    rank 0 resumes exactly, and each other rank reseeds from the restored state plus its rank, so no
    two ranks draw alike and a resume from the same checkpoint is still reproducible.
    """

    def __init__(self) -> None:
        self.rank = 0

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.rank = trainer.global_rank  # setup runs before a checkpoint's callback states are loaded

    def state_dict(self) -> dict[str, Any]:
        # Only tensors, numbers and tuples, so the checkpoint still loads with weights_only=True.
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        return {
            "python": random.getstate(),
            "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        random.setstate(state_dict["python"])
        name, keys, pos, has_gauss, gauss = state_dict["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
        torch.set_rng_state(state_dict["torch"])
        cuda = state_dict["cuda"]
        if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        if self.rank > 0:  # rank 0's states, saved: give this rank its own streams, derived from them
            seed = int(torch.randint(2**31, (1,)).item()) + 7919 * self.rank
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)  # also every CUDA device


# ---- a small training set's epochs -------------------------------------------------------------
def floor_epochs(epochs: int, steps_per_epoch: int, min_steps: int, max_factor: float) -> int:
    """The epochs to train: ``epochs``, or more where ``epochs`` x ``steps_per_epoch`` is under ``min_steps``:
    the fewest epochs that reach ``min_steps``, at most ``max_factor`` x ``epochs`` (rounded down)."""
    if steps_per_epoch <= 0 or epochs * steps_per_epoch >= min_steps:
        return epochs
    return max(epochs, min(math.ceil(min_steps / steps_per_epoch), int(max_factor * epochs)))


class StepFloor(Callback):
    """A from-scratch recipe's epochs on a small training set: at least ``min_steps`` optimiser steps in all, by
    training more epochs than ``trainer.max_epochs`` (at most ``max_factor`` times as many); a larger set trains
    ``trainer.max_epochs`` as written. ``min_steps`` null (the default): off.

    Why: a recipe's epochs are counted for a few thousand images; 600 images at batch 64 are 10 steps an epoch,
    400 optimiser steps in 40 epochs, too few for a ViT from scratch (docs/small-folders.md has the measurements).
    The count is set in ``setup``, after the data's own setup and before ``configure_optimizers`` plans the lr
    schedule over ``trainer.estimated_stepping_batches``, so the schedule spans the epochs trained. It depends on
    the training set's length alone, so a resumed run (``--ckpt_path last``) computes the same count. `vit fit`
    turns it off where the command line gives ``--trainer.max_epochs`` or ``--trainer.max_steps``: an explicit
    count wins. A run with ``max_steps`` set, or whose epoch length is unknown (a stream), is left as it is.
    """

    def __init__(self, min_steps: int | None = None, max_factor: float = 4.0) -> None:
        if min_steps is not None and min_steps < 1:
            raise UserValueError(f"step_floor.min_steps must be a positive number of steps or null, not {min_steps}")
        if max_factor < 1:
            raise UserValueError(f"step_floor.max_factor must be 1 or more, not {max_factor}")
        self.min_steps, self.max_factor = min_steps, max_factor
        self.chosen: int | None = None  # the epochs set, once set

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        loop = trainer.fit_loop
        if stage != "fit" or self.min_steps is None or loop.max_epochs is None or loop.max_epochs < 1:
            return
        if loop.max_steps not in (None, -1):
            return  # steps were asked for: they say how long the run is
        loop.setup_data()  # as Trainer.estimated_stepping_batches does (configure_optimizers reuses the loader)
        batches = trainer.num_training_batches
        if math.isinf(batches) or batches < 1:
            return
        per_epoch = math.ceil(batches / trainer.accumulate_grad_batches)
        epochs = loop.max_epochs
        self.chosen = floor_epochs(epochs, per_epoch, self.min_steps, self.max_factor)
        if self.chosen != epochs:
            loop.max_epochs = self.chosen
            rank_zero_info(
                f"step_floor: {per_epoch} optimiser steps an epoch x trainer.max_epochs {epochs} = "
                f"{per_epoch * epochs} steps, under step_floor.min_steps {self.min_steps}: training "
                f"{self.chosen} epochs ({per_epoch * self.chosen} steps"
                + (f", capped at step_floor.max_factor {self.max_factor:g} x {epochs}" if
                   per_epoch * self.chosen < self.min_steps else "")
                + "). --trainer.max_epochs N on the command line trains N epochs instead")


# ---- what a run worked around ------------------------------------------------------------------
class TrainingReport(Callback):
    """Reports the world size of a distributed run once, then, each training epoch, the steps the fp16
    GradScaler skipped and the images replaced.

    With ``precision: 16-mixed`` torch's GradScaler skips an optimiser step whose gradients are not
    finite and lowers its scale; a lower scale after a step is how a skipped step shows. (bf16 needs
    no scaler, and a non-finite loss stops the run in the task's training step.) Replaced images come
    from a training set with ``replacements()``, as `vit.data.folder.ImageFiles` has.
    """

    def __init__(self) -> None:
        self.skipped_steps = 0
        self.replaced_before = 0  # the training set's count at the end of the last epoch
        self._scale: float | None = None
        self._step = 0

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.world_size > 1:
            rank_zero_info(f"world size {trainer.world_size}: {trainer.num_nodes} nodes x {trainer.num_devices} "
                           f"processes each ({type(trainer.strategy).__name__})")

    @staticmethod
    def _scaler(trainer: Trainer) -> Any:
        return getattr(trainer.precision_plugin, "scaler", None)

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        scaler = self._scaler(trainer)
        self._scale = scaler.get_scale() if scaler is not None else None
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        scaler = self._scaler(trainer)
        if self._scale is not None and scaler is not None and scaler.get_scale() < self._scale:
            self.skipped_steps += 1
            log.warning("step %d: gradients were not finite, the GradScaler skipped the optimiser step "
                        "(%d skipped so far)", self._step, self.skipped_steps)
        self._scale = None

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._scaler(trainer) is not None:
            pl_module.log("skipped_steps", float(self.skipped_steps))
        dataset = _train_dataset(trainer)
        if dataset is None:
            return
        total, files = dataset.replacements()
        # Loader workers may already be fetching the next epoch, so the count is cumulative: take the difference.
        replaced, self.replaced_before = total - self.replaced_before, total
        pl_module.log("replaced_images", float(replaced), reduce_fx="sum", sync_dist=True)  # all ranks' images
        if replaced:
            shown = ", ".join(files[:5]) + (" ..." if len(files) > 5 else "")
            log.warning("epoch %d: replaced %d undecodable images by others of their class (%.2f%% of %d): %s",
                        trainer.current_epoch, replaced, 100 * replaced / len(dataset), len(dataset), shown)


def _train_dataset(trainer: Trainer) -> Any:
    """The training set of the trainer's datamodule if it counts replaced images, else None."""
    dataset = getattr(trainer.datamodule, "train_set", None)
    return dataset if isinstance(dataset, CountsReplacements) else None


# ---- resuming at an epoch's end ----------------------------------------------------------------------------
class EpochEndResume(_CheckpointConnector):
    """Lightning's checkpoint connector, resuming a checkpoint of an epoch's end at the next epoch's start, with
    ``max_steps`` set as without it (`vit fit` installs it on its trainer).

    lightning 2.6.x (2.6.6 here, with torch 2.14.1): with ``max_steps`` set the fit loop restarts whatever the
    checkpoint (``_FitLoop.restarting``: ``... or self._iteration_based_training()``). A checkpoint saved in
    ``on_train_epoch_end`` (`LastCheckpoint`'s; the epoch processed, not yet completed) then reruns that epoch's
    end: the epoch is counted twice, and where that makes ``max_epochs`` the run stops without training on (the
    recipes' ``max_steps``: a FixMatch run killed after an epoch ended with that epoch's weights). Without
    ``max_steps`` Lightning resumes it as not restarting (``RESUMED_ON_EPOCH_END``): so does this. An epoch
    cut short by ``max_steps`` (its last batch not reached) is left to Lightning.
    """

    def restore_loops(self) -> None:
        super().restore_loops()
        loop = self.trainer.fit_loop
        epochs = loop.epoch_progress.total
        if (self.trainer.state.fn == TrainerFn.FITTING and loop.restarting and loop._iteration_based_training()
                and epochs.ready == epochs.started == epochs.processed == epochs.completed + 1
                and loop.epoch_loop.batch_progress.is_last_batch):
            _Loop.restarting.fset(loop, False)  # past _FitLoop's setter, which would set it again


# ---- `vit pretrain` ----------------------------------------------------------------------------
class VitTrainer(Trainer):
    """Lightning's Trainer, plus ``pretrain``: LightningCLI builds one subcommand per Trainer method."""

    def pretrain(
        self, model: LightningModule, train_dataloaders: Any = None, val_dataloaders: Any = None,
        datamodule: Any = None, ckpt_path: str | None = None,
    ) -> None:
        """Pre-train a self-supervised model (MAE) on unlabelled images: `fit`, for configs/pretrain/ recipes."""
        self.fit(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path)


__all__ = ["AtomicCheckpointIO", "BestCheckpoint", "EpochEndResume", "LastCheckpoint", "RandomState", "TrainingReport",
           "VitTrainer"]


class TrainingCurves(Callback):
    """``curves.png`` in the run's folder (beside the confusion matrix) when `vit fit` ends: training loss, val
    loss and accuracy, and the lr, against the step, from what the task logged (a resumed run: from the resume on)."""

    def __init__(self) -> None:
        self.train_loss: list[tuple[int, float]] = []
        self.lr: list[tuple[int, float]] = []
        self.val: dict[str, list[tuple[int, float]]] = {}

    def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.optimizers:  # the lr this step uses, at the step count it ends with (as the loss below)
            self.lr.append((trainer.global_step + 1, float(trainer.optimizers[0].param_groups[-1]["lr"])))

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = trainer.callback_metrics.get("train_loss")
        if loss is not None:
            self.train_loss.append((trainer.global_step, float(loss)))

    def on_validation_end(self, trainer: Trainer, pl_module: Any) -> None:
        # (Not on_validation_epoch_end: callbacks' run before the task's, where a multi-label task logs val_map, and
        # Lightning gathers the epoch's metrics only after both: that hook saw none, or the epoch before's.)
        if trainer.sanity_checking:
            return
        for name, value in trainer.callback_metrics.items():
            if name.startswith("val_") and value.numel() == 1:
                self.val.setdefault(name, []).append((trainer.global_step, float(value)))

    def on_fit_end(self, trainer: Trainer, pl_module: Any) -> None:
        log_dir = trainer.log_dir  # on every rank: under DDP it is a broadcast, which rank 0 alone would hang in
        if not trainer.is_global_zero or log_dir is None or not (self.train_loss or self.val):
            return
        from vit.reports import save_figure, training_curves_figure, validation_panel

        figure = training_curves_figure(self.train_loss, self.val, self.lr)
        path = save_figure(figure, Path(log_dir) / "curves.png")
        print(f"training curves saved to {path} (loss, {validation_panel(self.val)[0]}, learning rate)")
