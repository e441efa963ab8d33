"""The `vit` command: LightningCLI's fit/validate/test/predict, plus a few helper commands.

    vit fit --config configs/digits.yaml                 train (then test the best checkpoint)
    vit test --config configs/digits.yaml --ckpt_path best.ckpt
    vit fit --config configs/digits.yaml --ckpt_path last   resume an interrupted run
    vit fit --config configs/digits.yaml --config configs/loggers/wandb.yaml
    vit predict --ckpt best.ckpt images/ a.png --out preds.csv --top_k 5   (see `vit.predict`)
    vit fit --config configs/digits.yaml --print_config

Model and data are chosen in subclass mode (``model.class_path``, ``data.class_path``), usually by
a config from configs/, or e.g. ``--model vit.tasks.ImageClassifier --data vit.data.Digits``.
The datamodule's attributes named in ``LINKED_FROM_DATA`` are passed to the model argument of the
same name, when both exist.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

# Commands outside LightningCLI, as "module:function" taking argv; imported only when used,
# so `vit --help` stays fast.
COMMANDS: dict[str, str] = {
    "attention": "vit.explain.command:main",
    "translate": "vit.tasks.translate:translate_command",
}

# Datamodule attributes linked into the model's __init__ argument of the same name. A link is
# skipped when the chosen datamodule lacks the attribute or the chosen model lacks the argument.
LINKED_FROM_DATA: tuple[str, ...] = (
    "num_classes", "class_names", "img_size", "in_chans", "mean", "std", "crop_pct", "interpolation",
    "tokenizers",
)

# `vit predict --ckpt ...` is a plain command that needs no config (see vit/predict.py); `vit predict`
# without --ckpt is LightningCLI's predict over the datamodule.
PREDICT_FILES = "vit.predict:main"


def _build_cli_class() -> type:
    """Define the LightningCLI subclass lazily, so importing this module stays cheap."""
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar, RichProgressBar
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
    from lightning.pytorch.loggers import CSVLogger

    class VitCLI(LightningCLI):
        """LightningCLI with data->model links, default callbacks, a CSV logger and test-after-fit."""

        def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
            for name in LINKED_FROM_DATA:
                parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")
            # The checkpoint callback is configurable as `checkpoint.*` (e.g. another monitor).
            parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
            parser.set_defaults({
                "checkpoint.monitor": "val_acc", "checkpoint.mode": "max", "checkpoint.save_last": True,
                "checkpoint.filename": "best-{epoch}-{step}",
            })
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

        def before_instantiate_classes(self) -> None:
            config = self.config[self.subcommand] if self.subcommand else self.config
            if config.get("num_threads"):
                import torch

                torch.set_num_threads(config["num_threads"])

        def instantiate_trainer(self, **kwargs: Any) -> Any:
            cfg = self._get(self.config_init, "trainer", default={})
            own = list(cfg.get("callbacks") or [])
            extra = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
            if any(isinstance(c, ModelCheckpoint) for c in own):
                # The config brings its own checkpointing (e.g. another metric); ours would duplicate it.
                extra = [c for c in extra if not isinstance(c, ModelCheckpoint)]
            for best in [c for c in extra if isinstance(c, ModelCheckpoint) and c.save_last]:
                # Since Lightning 2.6, save_last writes last.ckpt only when a top-k checkpoint is saved
                # at the same step, so an epoch without a better val metric would not be resumable.
                # A second, metric-free checkpoint rewrites last.ckpt after every epoch (or every
                # `every_n_train_steps`), which is what `--ckpt_path last` should resume from.
                best.save_last = False
                extra.append(ModelCheckpoint(
                    dirpath=best.dirpath, filename=ModelCheckpoint.CHECKPOINT_NAME_LAST, monitor=None,
                    save_top_k=1, enable_version_counter=False,
                    every_n_train_steps=best._every_n_train_steps or None,
                ))
            logger = cfg.get("logger")
            if logger is None or logger is True:  # Lightning would pick TensorBoard; CSV is plainer
                root = cfg.get("default_root_dir") or os.getcwd()
                kwargs["logger"] = logger = CSVLogger(save_dir=root)
            callbacks = own + extra
            if logger is not False and not any(isinstance(c, LearningRateMonitor) for c in callbacks):
                extra.append(LearningRateMonitor(logging_interval="step"))
            show_bar = cfg.get("enable_progress_bar") is not False
            if show_bar and not any(isinstance(c, ProgressBar) for c in callbacks):
                extra.append(RichProgressBar())
            return self._instantiate_trainer({**cfg, **kwargs}, extra)

        def before_fit(self) -> None:
            ckpt_path = self.config_init[self.subcommand].get("ckpt_path")
            if ckpt_path == "last":
                # Lightning only warns when there is nothing to resume from; a user asked to resume.
                found = _last_checkpoint(self.trainer)
                if found is None:
                    dirs = [str(cb.dirpath) for cb in self.trainer.checkpoint_callbacks]
                    raise FileNotFoundError(
                        f"--ckpt_path last: no last*.ckpt in {', '.join(dirs) or 'any checkpoint folder'}; "
                        "set `checkpoint.dirpath` to the folder of the interrupted run's checkpoints"
                    )

        def after_fit(self) -> None:
            if not self.config[self.subcommand].get("test_after_fit"):
                return
            checkpoint = self.trainer.checkpoint_callback
            best = checkpoint.best_model_path if checkpoint is not None else ""
            if self.trainer.fast_dev_run or not best:
                print("test_after_fit: no best checkpoint was saved; testing the final weights")
                best = None
            results = self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best)
            # Report the test counterpart of the metric the checkpoint was chosen by.
            monitor = (checkpoint.monitor if checkpoint is not None else None) or "val_acc"
            key = "test_" + monitor.removeprefix("val_")
            value = results[0].get(key) if results else None
            if value is not None:
                name = "accuracy" if key == "test_acc" else key.removeprefix("test_").replace("_", " ")
                print(f"test {name} of {best or 'the final weights'}: {value:.4f}")

    return VitCLI


def _last_checkpoint(trainer: Any) -> str | None:
    """The newest last*.ckpt in the trainer's checkpoint folders, or None."""
    found: list[Path] = []
    for cb in trainer.checkpoint_callbacks:
        if cb.dirpath is not None:  # None: decided at fit start from the logger's new version dir
            found += [p for p in Path(cb.dirpath).glob("last*.ckpt") if p.is_file()]
    return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None


DESCRIPTION = (
    "vit: train and evaluate Vision Transformers. Subcommands fit/validate/test/predict take YAML "
    "configs (see configs/). Also: `vit predict --ckpt CKPT IMAGES... --out preds.csv` classifies "
    "image files with a checkpoint alone; other commands: {others}."
)


def cli(argv: list[str] | None = None) -> Any:
    """Run LightningCLI with this project's defaults on ``argv`` (default: sys.argv) and return it."""
    VitCLI = _build_cli_class()
    return VitCLI(
        model_class=None, datamodule_class=None, subclass_mode_model=True, subclass_mode_data=True,
        save_config_kwargs={"overwrite": True}, args=argv,
        parser_kwargs={"description": DESCRIPTION.format(others=", ".join(sorted(COMMANDS)) or "none")},
    )


def main(args: list[str] | None = None) -> None:
    """Entry point of the `vit` console script."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] in COMMANDS:
        module, function = COMMANDS[argv[0]].split(":")
        getattr(importlib.import_module(module), function)(argv[1:])
        return
    if argv and argv[0] == "predict" and any(a == "--ckpt" or a.startswith("--ckpt=") for a in argv[1:]):
        module, function = PREDICT_FILES.split(":")
        getattr(importlib.import_module(module), function)(argv[1:])
        return
    cli(None if args is None else argv)  # None: LightningCLI reads sys.argv itself


if __name__ == "__main__":
    main()
