"""LightningCLI for `vit fit | validate | test | predict`, on Lightning's public API only.

    vit fit --config configs/digits.yaml                 train (then test the best checkpoint)
    vit fit --config configs/digits.yaml --ckpt_path last   resume an interrupted run
    vit test --config configs/digits.yaml --ckpt_path best.ckpt
    vit fit --config configs/digits.yaml --config configs/loggers/wandb.yaml
    vit fit --config configs/digits.yaml --print_config

Model and data are chosen in subclass mode (``model.class_path``, ``data.class_path``), usually by
a config from configs/. The datamodule's attributes named in ``LINKED_FROM_DATA`` are passed to the
model argument of the same name, when both exist. What this adds to LightningCLI: a best checkpoint
(``checkpoint.*``) and a ``last.ckpt`` rewritten every epoch, both written atomically; a CSV logger by
default, an LR monitor, a progress bar, a report of skipped steps and replaced images, and the random
generators saved in checkpoints (an exact resume);
``--ckpt_path last`` that says when last.ckpt is damaged (or, with ``--resume_from_readable``, falls
back to the newest intact checkpoint); ``--test_after_fit`` and ``--num_threads``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.io import CheckpointIO

from vit.checkpoint import (
    DamagedCheckpointError,
    checkpoint_progress,
    damaged_message,
    is_intact,
    read_checkpoint,
    task_of,
)
from vit.training import AtomicCheckpointIO, LastCheckpoint, RandomState, TrainingReport

# Datamodule attributes linked into the model's __init__ argument of the same name. A link is
# skipped when the chosen datamodule lacks the attribute or the chosen model lacks the argument.
LINKED_FROM_DATA: tuple[str, ...] = (
    "num_classes", "class_names", "img_size", "in_chans", "mean", "std", "crop_pct", "interpolation",
    "tokenizers",
)

DESCRIPTION = (
    "vit: train and evaluate Vision Transformers. Subcommands fit/validate/test/predict take YAML "
    "recipes (see configs/). `vit --help` lists the other commands (predict --ckpt, export, probe, attention, "
    "translate)."
)


class VitCLI(LightningCLI):
    """LightningCLI with data->model links, best and last checkpoints, default loggers and test-after-fit."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for name in LINKED_FROM_DATA:
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")
        # The best checkpoint, configurable as `checkpoint.*` (another monitor, a fixed folder, ...).
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({
            "checkpoint.monitor": "val_acc", "checkpoint.mode": "max", "checkpoint.filename": "best-{epoch}-{step}",
        })
        # last.ckpt, rewritten whatever the metric says (Lightning 2.6's save_last only follows top-k
        # saves), in the same folder and at the same interval as the best checkpoint.
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.link_arguments("checkpoint.dirpath", "last_checkpoint.dirpath")
        parser.link_arguments("checkpoint.every_n_train_steps", "last_checkpoint.every_n_train_steps")
        # No default model or data class: jsonargparse carries a default class's init_args
        # over to another class with the same argument names (lr, weight_decay, ...), which
        # would silently change e.g. a Translator's optimiser. A config names both.
        parser.add_argument(
            "--test_after_fit", type=bool, default=False,
            help="after `fit`, test the best checkpoint and print the test accuracy",
        )
        parser.add_argument(
            "--num_threads", type=int | None, default=None,
            help="CPU threads for torch (default: torch's choice); 1 suits tiny models on busy machines",
        )
        parser.add_argument(
            "--resume_from_readable", type=bool, default=False,
            help="with --ckpt_path last: if last.ckpt is damaged, resume from the newest intact checkpoint "
            "in its folder (and say so) instead of stopping",
        )

    def _subcommand_config(self, config: Any) -> Any:
        return config[self.subcommand] if self.subcommand else config

    def before_instantiate_classes(self) -> None:
        config = self._subcommand_config(self.config)
        if config.get("num_threads"):
            import torch

            torch.set_num_threads(config["num_threads"])
        init_args = config.get("model", {}).get("init_args") or {}
        if config.get("ckpt_path") and init_args.get("pretrained"):
            init_args["pretrained"] = None  # the checkpoint holds the weights; the original file may be gone

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer_config = self._subcommand_config(self.config_init).get("trainer") or {}
        callbacks = list(trainer_config.get("callbacks") or [])
        logger = trainer_config.get("logger")
        if logger is None or logger is True:  # Lightning would pick TensorBoard; CSV is plainer
            root = trainer_config.get("default_root_dir") or os.getcwd()
            kwargs["logger"] = logger = CSVLogger(save_dir=root)
        if logger is not False and not any(isinstance(c, LearningRateMonitor) for c in callbacks):
            callbacks.append(LearningRateMonitor(logging_interval="step"))
        show_bar = trainer_config.get("enable_progress_bar") is not False
        if show_bar and not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(RichProgressBar())
        callbacks += [TrainingReport(), RandomState()]
        plugins = trainer_config.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())  # checkpoints that survive a kill during the save
        return super().instantiate_trainer(callbacks=callbacks, plugins=plugins, **kwargs)

    @property
    def best_checkpoint(self) -> ModelCheckpoint | None:
        """The callback that keeps the best checkpoint by ``checkpoint.monitor``."""
        return self._subcommand_config(self.config_init).get("checkpoint")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        # Before LightningCLI rebuilds the model from --ckpt_path's hyperparameters (and fails obscurely
        # on a damaged file or another task's checkpoint), read what the file holds.
        subcommand = self.config.get("subcommand")
        if subcommand:
            check_checkpoint_task(self.config[subcommand])

    def before_fit(self) -> None:
        config = self._subcommand_config(self.config_init)
        if config.get("ckpt_path") == "last":
            config["ckpt_path"] = self._resolve_last(config.get("resume_from_readable"))

    def _resolve_last(self, fall_back: bool) -> str:
        """The checkpoint ``--ckpt_path last`` resumes from: an intact last*.ckpt, or a clear error."""
        # Lightning only warns when there is nothing to resume from; a user asked to resume.
        found = last_checkpoint(self.trainer)
        if found is None:
            dirs = [str(cb.dirpath) for cb in self.trainer.checkpoint_callbacks]
            raise FileNotFoundError(
                f"--ckpt_path last: no last*.ckpt in {', '.join(dirs) or 'any checkpoint folder'}; "
                "set `checkpoint.dirpath` to the folder of the interrupted run's checkpoints"
            )
        if is_intact(found):
            return found
        folder = Path(found).parent
        intact = [p for p in sorted(folder.glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
                  if p != Path(found) and is_intact(p)]
        if not fall_back or not intact:
            hint = "" if fall_back else " (or --resume_from_readable true to resume from the newest intact one)"
            raise DamagedCheckpointError(
                damaged_message(found, "not a complete torch zip file")
                + f"\nResume from one of them with --ckpt_path PATH{hint}."
            )
        epoch, step = checkpoint_progress(intact[0])
        self.say(f"--ckpt_path last: {found} is damaged; falling back to the newest intact checkpoint, {intact[0]} "
              f"(epoch {epoch}, step {step})")
        return str(intact[0])

    def after_fit(self) -> None:
        if not self._subcommand_config(self.config).get("test_after_fit"):
            return
        checkpoint = self.best_checkpoint
        best = checkpoint.best_model_path if checkpoint is not None else ""
        if self.trainer.fast_dev_run or not best:
            self.say("test_after_fit: no best checkpoint was saved; testing the final weights")
            best = None
        results = self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best)
        # Report the test counterpart of the metric the checkpoint was chosen by.
        monitor = (checkpoint.monitor if checkpoint is not None else None) or "val_acc"
        key = "test_" + monitor.removeprefix("val_")
        value = results[0].get(key) if results else None
        if value is not None:
            name = "accuracy" if key == "test_acc" else key.removeprefix("test_").replace("_", " ")
            self.say(f"test {name} of {best or 'the final weights'}: {value:.4f}")

    def say(self, message: str) -> None:
        """Print once, not once per DDP process."""
        if self.trainer.is_global_zero:
            print(message)


def check_checkpoint_task(config: Any) -> None:
    """A clear error when ``--ckpt_path`` is damaged, or holds another task than the configured model."""
    ckpt_path = config.get("ckpt_path")
    class_path = (config.get("model") or {}).get("class_path")
    if not ckpt_path or not Path(ckpt_path).is_file() or not class_path:
        return
    from vit.tasks import TASKS

    found = task_of(read_checkpoint(ckpt_path, mmap=True))  # a damaged file: an error naming it and its neighbours
    wanted = class_path.rsplit(".", 1)[-1]
    if found in TASKS and wanted in {t.__name__ for t in TASKS.values()} and TASKS[found].__name__ != wanted:
        raise ValueError(
            f"--ckpt_path {ckpt_path} holds a {TASKS[found].__name__} checkpoint ({found}), but the config's model "
            f"is {class_path}: use a checkpoint written by a recipe of the same task"
        )


def last_checkpoint(trainer: Trainer) -> str | None:
    """The newest last*.ckpt in the trainer's checkpoint folders, or None."""
    found: list[Path] = []
    for cb in trainer.checkpoint_callbacks:
        if cb.dirpath is not None:  # None: decided at fit start from the logger's new version dir
            found += [p for p in Path(cb.dirpath).glob("last*.ckpt") if p.is_file()]
    return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None


def cli(argv: list[str] | None = None, **kwargs: Any) -> VitCLI:
    """Run the `vit` LightningCLI on ``argv`` (default: the command line) and return it."""
    return VitCLI(
        model_class=None, datamodule_class=None, subclass_mode_model=True, subclass_mode_data=True,
        save_config_kwargs={"overwrite": True}, args=argv,
        parser_kwargs={"description": DESCRIPTION, "prog": "vit"}, **kwargs,
    )
