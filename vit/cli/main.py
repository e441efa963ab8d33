"""LightningCLI for `vit fit | validate | test | predict`, on Lightning's public API only.

    vit fit --config configs/digits.yaml                 train (then test the best checkpoint)
    vit fit --config configs/digits.yaml --ckpt_path last   resume an interrupted run
    vit test --config configs/digits.yaml --ckpt_path best   the latest run's best checkpoint in the config's folder
    vit fit --config configs/digits.yaml --config configs/loggers/wandb.yaml
    vit fit --config configs/digits.yaml --print_config
    vit pretrain --config configs/pretrain/mae_digits.yaml   MAE pre-training (a `fit` of vit.tasks.MaskedAutoencoder)

Model and data are chosen in subclass mode (``model.class_path``, ``data.class_path``), usually by
a config from configs/. The datamodule's attributes named in ``LINKED_FROM_DATA`` are passed to the
model argument of the same name, when both exist. What this adds to LightningCLI: a best checkpoint
(``checkpoint.*``, saved after validation) and a ``last.ckpt`` rewritten every epoch (and every
``checkpoint.every_n_train_steps``) and at the end, both written atomically; a CSV logger by
default, an LR monitor, a progress bar, a report of skipped steps and replaced images, and the random
generators saved in checkpoints (an exact resume);
``--ckpt_path last`` that says when last.ckpt is damaged (or, with ``--resume_from_readable``, falls
back to the newest intact checkpoint); ``--test_after_fit`` and ``--num_threads``.
"""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path
from typing import Any, Literal

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ModelSummary
from lightning.pytorch.callbacks import ProgressBar as LightningProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from vit.checkpoints.io import (
    checkpoint_progress,
)
from vit.checkpoints.lora import base_to_resume
from vit.checkpoints.pretrained_cfg import pretrained_preprocessing
from vit.checkpoints.runs import checkpoint_by_name, experiment_folder
from vit.cli.after_fit import calibrate_run, calibration_mode, test_best
from vit.cli.ckpt_path import check_checkpoint_exists, check_checkpoint_task, resolve_last, resolved_path
from vit.cli.console import ModelReport, ProgressBar, quiet_dependencies
from vit.cli.parser import VitArgumentParser, imported_class
from vit.cli.training import (
    AtomicCheckpointIO,
    BestCheckpoint,
    EpochEndResume,
    LastCheckpoint,
    RandomState,
    StepFloor,
    TrainingCurves,
    TrainingReport,
    VitTrainer,
)
from vit.data.hf import is_hf_root
from vit.errors import UserValueError
from vit.preprocessing import DATA_KEYS

# Datamodule attributes linked into the model's __init__ argument of the same name. A link is
# skipped when the chosen datamodule lacks the attribute or the chosen model lacks the argument (MAE: mean, std).
LINKED_FROM_DATA: tuple[str, ...] = (
    "num_classes", "class_names", "img_size", "in_chans", "preprocessing", "mean", "std", "tokenizers",
)


DESCRIPTION = (
    "vit: train and evaluate Vision Transformers. Subcommands fit/pretrain/validate/test/predict take YAML "
    "recipes (see configs/). `vit --help` lists the other commands (predict --ckpt, export, probe, audit, attention, "
    "translate)."
)


class VitCLI(LightningCLI):
    """LightningCLI with data->model links, best and last checkpoints, default loggers and test-after-fit."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Lightning's subcommands and `pretrain` (`VitTrainer.pretrain`, a `fit` of a self-supervised task)."""
        return {**LightningCLI.subcommands(), "pretrain": LightningCLI.subcommands()["fit"]}

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Lightning's parser with short errors (`VitArgumentParser`). Built here, not by LightningCLI's
        ``parser_class`` argument, which Lightning 2.4 (our lowest) lacks; the rest is what its own does."""
        import lightning
        from jsonargparse import ActionConfigFile

        kwargs.setdefault("dump_header", [f"lightning.pytorch=={lightning.__version__}"])
        # No prefix matching: argparse would take --trainer.max_epoch for --trainer.max_epochs, silently. Set on
        # the main and each subcommand parser (LightningCLI builds both here); jsonargparse 4.32+ accepts it.
        kwargs.setdefault("allow_abbrev", False)
        parser = VitArgumentParser(**kwargs)
        parser.add_argument("-c", "--config", action=ActionConfigFile,
                            help="Path to a configuration file in json or yaml format.")
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for name in LINKED_FROM_DATA:
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")
        from vit.tasks.heads import data_label_kind  # here: `vit.tasks` imports the models, which --help need not

        # the data's kind of label, in the word the heads read ("single", "multi": `vit.tasks.heads.head_for`)
        parser.link_arguments("data.multi_label", "model.init_args.label_kind", compute_fn=data_label_kind,
                              apply_on="instantiate")
        # The best checkpoint, configurable as `checkpoint.*` (another monitor, a fixed folder, ...),
        # saved after validation; its every_n_train_steps is last.ckpt's interval (see BestCheckpoint).
        parser.add_lightning_class_args(BestCheckpoint, "checkpoint")
        parser.set_defaults({
            "checkpoint.monitor": "val_acc", "checkpoint.mode": "max", "checkpoint.filename": "best-{epoch}-{step}",
        })
        # last.ckpt, rewritten whatever the metric says (Lightning 2.6's save_last only follows top-k
        # saves), in the same folder, every epoch or every checkpoint.every_n_train_steps, and at the end.
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.link_arguments("checkpoint.dirpath", "last_checkpoint.dirpath")
        parser.link_arguments("checkpoint.every_n_train_steps", "last_checkpoint.every_n_train_steps")
        # More epochs on a small training set, for at least step_floor.min_steps optimiser steps (off unless set;
        # the command line's --trainer.max_epochs or --trainer.max_steps turns it off: see StepFloor).
        parser.add_lightning_class_args(StepFloor, "step_floor")
        # No default model or data class: jsonargparse carries a default class's init_args
        # over to another class with the same argument names (lr, weight_decay, ...), which
        # would silently change e.g. a Translator's optimiser. A config names both.
        parser.add_argument(
            "--test_after_fit", type=bool, default=False,
            help="after `fit`, test the best checkpoint and print the test accuracy",
        )
        parser.add_argument(
            "--calibrate", type=bool | Literal["temperature", "unknown"], default="temperature",
            help="after `fit`, calibrate the best checkpoint and last.ckpt on val and store it in them (as `vit "
            "calibrate`): 'temperature' (default) fits T (a T per class for multi-label), which changes no label "
            "and makes every probability vit prints, serves and exports calibrated; 'unknown' also fits an "
            "'unknown' score and threshold, so vit predict and vit serve answer 'unknown' for images far from the "
            "training data in their answer column (it turns away about 5%% of good ones: the threshold accepts "
            "95%% of val; true is its old spelling); false: neither (docs/confidence.md)",
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
        read_hf_data_as_such(config)
        init_args = config.get("model", {}).get("init_args") or {}
        follow_the_weights(config)  # before the pretrained source is dropped for a resume, below
        if config.get("ckpt_path") and init_args.get("pretrained"):
            # The checkpoint holds the weights, and the original file may be gone. One of adapters alone names its
            # base, which loads before the checkpoint (FSDP restores after sharding the model): that one stays.
            init_args["pretrained"] = base_to_resume(resolved_path(config))
        elif self.subcommand == "fit" and "pretrained" in init_args and not init_args.get("pretrained") and (
                (init_args.get("optim") or {}).get("layer_decay") or
                not str((init_args.get("finetune") or {}).get("class_path", "Full")).endswith("Full")):
            rank_zero_warn("model.init_args.pretrained is null, but this is a fine-tuning recipe (layer_decay, a "
                           "fine-tuning lr): random weights learn little from it. Without pretrained weights, train "
                           "with configs/scratch_small.yaml, made for that.")

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
        if show_bar and not any(isinstance(c, LightningProgressBar) for c in callbacks):
            callbacks.append(ProgressBar())
        show_summary = trainer_config.get("enable_model_summary") is not False
        if show_summary and not any(isinstance(c, ModelSummary) for c in callbacks):
            callbacks.append(ModelReport())
        callbacks += [TrainingReport(), RandomState(), TrainingCurves()]
        plugins = trainer_config.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(AtomicCheckpointIO())  # checkpoints that survive a kill during the save
        try:
            trainer = super().instantiate_trainer(callbacks=callbacks, plugins=plugins, **kwargs)
        except MisconfigurationException as e:  # Lightning's word for trainer settings this machine cannot run
            settings = ", ".join(f"{k}: {trainer_config.get(k)}" for k in ("accelerator", "devices", "strategy",
                                                                          "precision") if trainer_config.get(k))
            raise UserValueError(
                f"the trainer settings ({settings}) do not run here: {e}\nOn a machine without a GPU, add "
                "--trainer.accelerator cpu --trainer.precision 32-true (configs/finetune/folder_cpu.yaml is a "
                "CPU fine-tuning recipe)."
            ) from e
        trainer._checkpoint_connector = EpochEndResume(trainer)  # an epoch's end resumes with max_steps set too
        return trainer

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
            config = self.config[subcommand]
            self._explicit_length_wins(config, sys.argv[1:] if args is None else args)
            if config.get("checkpoint.monitor") == "val_acc":  # fit's default, for a task that logs no accuracy
                if subcommand == "pretrain":
                    config["checkpoint.monitor"], config["checkpoint.mode"] = "val_loss", "min"
                elif str(config.get("model.class_path") or "").endswith("Translator"):  # chrF moves on every tokenizer
                    config["checkpoint.monitor"], config["checkpoint.mode"] = "val_chrf", "max"
            if subcommand not in ("fit", "pretrain") and config.get("ckpt_path") in ("best", "last"):
                config["ckpt_path"] = checkpoint_by_name(config, config["ckpt_path"])
            check_checkpoint_exists(config)
            check_checkpoint_task(config)

    def _explicit_length_wins(self, config: Any, args: Any) -> None:
        """An epoch or step count given on the command line is what the run trains: no step floor."""
        given = [a.split("=", 1)[0] for a in args if isinstance(a, str)] if isinstance(args, list | tuple) else []
        named = [a for a in ("--trainer.max_epochs", "--trainer.max_steps") if a in given]
        if named and config.get("step_floor.min_steps") is not None:
            print(f"step_floor: off ({named[0]} given on the command line; step_floor.min_steps "
                  f"{config.get('step_floor.min_steps')} would have raised the epochs of a small training set)")
            config["step_floor.min_steps"] = None

    def before_fit(self) -> None:
        self._monitor_what_the_data_logs()
        config = self._subcommand_config(self.config_init)
        if config.get("ckpt_path") == "last":  # (the parsed config names folders; config_init holds callbacks)
            config["ckpt_path"] = resolve_last(self._subcommand_config(self.config), self.say)
        elif config.get("ckpt_path") == "best":  # Lightning knows a best checkpoint only within the run that saved it
            config["ckpt_path"] = checkpoint_by_name(self._subcommand_config(self.config), "best")
            epoch, step = checkpoint_progress(config["ckpt_path"])
            self.say(f"--ckpt_path best: resuming from {config['ckpt_path']} (epoch {epoch}, step {step}); the run "
                     "trains again from there (--ckpt_path last goes on from where it stopped)")

    def _monitor_what_the_data_logs(self) -> None:
        """fit's default monitor, val_acc, is a single-label run's: a multi-label one (data.multi_label, or a table
        read so) keeps its best checkpoint by val macro mAP, as configs/multilabel_cpu.yaml says, rather than
        failing after its first validation."""
        checkpoint = self.best_checkpoint
        multi_label = getattr(self.datamodule, "multi_label", False)
        if checkpoint is not None and checkpoint.monitor == "val_acc" and multi_label:
            checkpoint.monitor = "val_map"  # (mode max, as val_acc's)

    def before_pretrain(self) -> None:
        from vit.tasks.pretrain import MaskedAutoencoder

        if not isinstance(self.model, MaskedAutoencoder):
            raise UserValueError(f"vit pretrain trains a self-supervised model (vit.tasks.MaskedAutoencoder, see "
                                 f"configs/pretrain/), not a {type(self.model).__name__}: use vit fit for that")
        self.before_fit()

    def after_fit(self) -> None:
        config = self._subcommand_config(self.config)
        mode = calibration_mode(config.get("calibrate"))
        tta = calibrate_run(self, unknown=mode == "unknown") if mode else "none"  # first: the test uses val's TTA
        if config.get("test_after_fit"):
            test_best(self, tta)

    def say(self, message: str) -> None:
        """Print once, not once per DDP process."""
        if self.trainer.is_global_zero:
            print(message)


def follow_the_weights(config: Any) -> None:
    """The data follows the weights: each DataModule option of `vit.preprocessing.DATA_KEYS` the config leaves
    unset (None) takes the value the pretrained weights were trained with (a resumed or evaluated checkpoint's,
    else ``model.init_args.pretrained``'s: its timm tag, its file), and one line says which."""
    data_args = (config.get("data") or {}).get("init_args") or {}
    model_args = (config.get("model") or {}).get("init_args") or {}
    unset = [k for k in DATA_KEYS if k in data_args and data_args[k] is None]
    ckpt_path = config.get("ckpt_path")
    source = ckpt_path if ckpt_path and Path(str(ckpt_path)).is_file() else model_args.get("pretrained")
    if not unset or not source:
        return
    found = pretrained_preprocessing(str(source), model_args.get("model"))
    if found is None:
        rank_zero_info(f"preprocessing: {source} names no mean/std of its own: the DataModule's defaults; set "
                       f"data.init_args.mean/std if those weights were trained otherwise")
        return
    values, origin = found
    notes = []
    chans = getattr(data_class(config), "in_chans", None)
    if isinstance(chans, int) and len(values.get("mean", ())) not in (0, chans):
        # weights of other channels (a 1-channel digits checkpoint on a folder of photos): filling them in would
        # fail as a DataModule error; left out, the checkpoint's own check names the mismatch when it loads
        if "mean" in unset or "std" in unset:
            notes.append(f"mean and std stay the DataModule's own: the weights' are for {len(values['mean'])} "
                         f"channel(s), the data has {chans}")
        values = {k: v for k, v in values.items() if k not in ("mean", "std")}
    filled = [k for k in unset if k in values]
    for k in filled:
        data_args[k] = list(values[k]) if isinstance(values[k], tuple) else values[k]
    given = [f"{k} {data_args[k]}" for k in DATA_KEYS if k in data_args and k not in unset]
    notes = ([f"the config sets {', '.join(given)}"] if given else []) + notes
    rank_zero_info("preprocessing from " + origin + ": "
                   + (", ".join(f"{k} {data_args[k]}" for k in filled) or "nothing filled in")
                   + (f" ({'; '.join(notes)})" if notes else ""))


def read_hf_data_as_such(config: Any) -> None:
    """ImageFolder or LabelsFile given Hugging Face data (hf://, a save_to_disk or Parquet folder): read it with
    vit.data.HFDataset, which takes their options, so every recipe runs on such data unchanged."""
    data = config.get("data") or {}
    root = (data.get("init_args") or {}).get("root")
    if str(data.get("class_path")).endswith((".ImageFolder", ".LabelsFile")) and root and is_hf_root(root):
        data["class_path"] = "vit.data.hub.HFDataset"


def data_class(config: Any) -> type | None:
    """The DataModule class the config names (resolved to a full import path by the parser), if it imports."""
    return imported_class(str((config.get("data") or {}).get("class_path") or ""))


def run_arguments() -> list[str]:
    """The arguments of Trainer.fit, validate, test and predict other than the model and data (ckpt_path, and on
    Lightning 2.6 weights_only, verbose, return_predictions), which the config.yaml a run of each saves holds."""
    names: list[str] = []
    for method, model_and_data in LightningCLI.subcommands().items():
        for name in inspect.signature(getattr(Trainer, method)).parameters:
            if name != "self" and name not in model_and_data and name not in names:
                names.append(name)
    return names


class ConfigOnlyCLI(VitCLI):
    """`vit fit`'s parser and instantiation, without a Trainer: the model and data a config describes, for
    the commands that train nothing by gradient (`vit probe`, `vit audit`)."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        # a run's own config.yaml names the arguments of its Trainer method (ckpt_path, and weights_only on
        # Lightning 2.5+; test's verbose, predict's return_predictions): read it as the run wrote it, use none of them
        for name in run_arguments():
            parser.add_argument(f"--{name}", type=Any, default=None,
                                help=f"ignored here: a `vit fit|validate|test|predict` run's {name}, as its "
                                "config.yaml names it")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # LightningCLI warns when args differ from sys.argv; ours are sys.argv less the command's own options.
        self.config = parser.parse_args(args)

    def instantiate_trainer(self, **kwargs: Any) -> None:  # nothing trains: no devices to set up
        return None


def build_model_and_data(argv: list[str], command: str) -> tuple[Any, Any, Path]:
    """(ImageClassifier with its pretrained weights loaded, ImageDataModule, the folder `vit fit` logs runs in)
    from `vit fit`'s arguments, through the same parser."""
    from vit.data.base import ImageDataModule
    from vit.tasks import ImageClassifier

    quiet_dependencies()
    built = ConfigOnlyCLI(model_class=None, datamodule_class=None, subclass_mode_model=True,
                          subclass_mode_data=True, args=argv, run=False,
                          parser_kwargs={"description": DESCRIPTION, "prog": command})
    if not isinstance(built.model, ImageClassifier) or not isinstance(built.datamodule, ImageDataModule):
        raise UserValueError(f"{command} needs an image classifier and an image datamodule (vit.tasks.ImageClassifier, "
                             f"vit.data.*), got {type(built.model).__name__} and {type(built.datamodule).__name__}")
    built.model.configure_model()  # the pretrained weights, which a Trainer would load
    return built.model, built.datamodule, experiment_folder(built.config.get("trainer") or {})


def cli(argv: list[str] | None = None, **kwargs: Any) -> VitCLI:
    """Run the `vit` LightningCLI on ``argv`` (default: the command line) and return it."""
    quiet_dependencies()
    return VitCLI(
        model_class=None, datamodule_class=None, subclass_mode_model=True, subclass_mode_data=True,
        save_config_kwargs={"overwrite": True}, args=argv, trainer_class=VitTrainer,
        parser_kwargs={"description": DESCRIPTION, "prog": "vit"}, **kwargs,
    )
