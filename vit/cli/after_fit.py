"""What `vit fit` does once training ends: calibrate the run's checkpoints on val (``--calibrate``: a temperature by
default, the unknown score on request; `vit.deploy.calibration` does the fitting), then, with
``--test_after_fit``, test the best checkpoint and print the figure it was chosen by.

Functions of the running `VitCLI` (its trainer, model, data and best-checkpoint callback), kept apart from the
parser and the instantiation that `vit.cli.main` owns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import IterableDataset

from vit.checkpoints.io import checkpoint_progress
from vit.data.base import no_test_reason


def calibration_mode(value: Any) -> str | None:
    """``--calibrate`` as one word: "temperature", "unknown" (``true``: its old spelling), or None (``false``)."""
    if value is False or value is None or str(value).lower() in ("false", "none"):
        return None
    return "unknown" if value is True or str(value).lower() in ("true", "unknown") else "temperature"


def calibrate_run(cli: Any, unknown: bool = False) -> str:
    """Fit T (and with ``unknown`` the unknown score) on the best checkpoint and store it in it and in last.ckpt
    (`vit.deploy.calibration`): each checkpoint read once and written once. Returns the TTA calibration chose on
    val, in every process."""
    from vit.data.base import ImageDataModule
    from vit.tasks import ImageClassifier

    checkpoint, trainer = cli.best_checkpoint, cli.trainer
    best = checkpoint.best_model_path if checkpoint is not None else ""
    if trainer.fast_dev_run or not best or not isinstance(cli.model, ImageClassifier) or \
            not isinstance(cli.datamodule, ImageDataModule):
        return "none"
    if trainer.world_size > 1 and isinstance(cli.datamodule.train_set, IterableDataset):
        # streamed shards read by one process broadcast to the others, which are not reading: it would hang
        cli.say(f"calibration: streamed data is calibrated in one process; run vit calibrate --ckpt {best} "
                "--config CONFIG")
        return "none"
    tta = "none"
    figure_dir = trainer.log_dir  # in every process: it broadcasts, and one rank alone would hang the rest
    if trainer.is_global_zero:
        from vit.deploy.calibration import calibrate_checkpoint

        try:
            confidence = calibrate_checkpoint(best, cli.datamodule, figure_dir=figure_dir, say=cli.say,
                                              unknown=unknown)
            tta = confidence.calibration.tta
        except Exception as e:  # a post-hoc step: the trained checkpoint stands whatever happens here
            cli.say(f"calibration skipped ({type(e).__name__}: {e}); the checkpoint is as trained. "
                    f"Retry with: vit calibrate --ckpt {best} --config CONFIG --calibrate "
                    f"{'unknown' if unknown else 'temperature'}")
        else:
            try:
                _calibrate_last(cli, best, confidence, unknown)
            except Exception as e:  # the best checkpoint is calibrated; last.ckpt stands as trained
                cli.say(f"last.ckpt not calibrated ({type(e).__name__}: {e}); the best checkpoint is")
    return trainer.strategy.broadcast(tta)  # also the barrier: the others test the calibrated checkpoint


def _calibrate_last(cli: Any, best: str, confidence: Any, unknown: bool) -> None:
    """last.ckpt calibrated too, so that every checkpoint a user may pick answers alike: the best one's
    calibration where it holds the same weights (saved at the same step), else fit on its own weights."""
    from vit.deploy.calibration import calibrate_checkpoint, save_confidence

    saver = cli._subcommand_config(cli.config_init).get("last_checkpoint")
    last = Path(saver.dirpath) / f"{saver.CHECKPOINT_NAME_LAST}{saver.FILE_EXTENSION}" if saver and \
        saver.dirpath else None
    if last is None or not last.is_file() or last.resolve() == Path(best).resolve():
        return
    step = checkpoint_progress(best)[1]  # the same optimiser step: the same weights (the epoch may read one on)
    if step is not None and checkpoint_progress(last)[1] == step:
        save_confidence(last, confidence)
        cli.say(f"calibrated {last} too (the same weights as the best checkpoint: the same calibration)")
        return
    lines: list[str] = []
    calibrate_checkpoint(last, cli.datamodule, say=lines.append, unknown=unknown, draw=False)
    cli.say(f"calibrated {last} too, on its own weights: {lines[0].strip() if lines else 'done'}")


def test_best(cli: Any, tta: str = "none") -> None:
    """Test the best checkpoint (with the TTA calibration chose on val) and print the test counterpart of the
    metric that chose it; with no test split, val's figure, named as such."""
    checkpoint, trainer, model = cli.best_checkpoint, cli.trainer, cli.model
    best = checkpoint.best_model_path if checkpoint is not None else ""
    if trainer.fast_dev_run or not best:
        cli.say("test_after_fit: no best checkpoint was saved; testing the final weights")
        best, tta = None, "none"
    monitor = (checkpoint.monitor if checkpoint is not None else None) or "val_acc"
    model.test_tta = tta
    if tta != "none":
        cli.say(f"testing with TTA {tta}: calibration measured it better on val")
    no_test = no_test_reason(cli.datamodule)
    if no_test:
        # Nothing held out: report val, named as such (it chose the checkpoint, so it flatters).
        results = trainer.validate(model, datamodule=cli.datamodule, ckpt_path=best)
        key, split = monitor, "val"
    else:
        results = trainer.test(model, datamodule=cli.datamodule, ckpt_path=best)
        key, split = "test_" + monitor.removeprefix("val_"), "test"
    value = results[0].get(key) if results else None
    if value is None:
        return
    name = "accuracy" if key.endswith("_acc") else key.removeprefix(f"{split}_").replace("_", " ")
    name = "macro mAP" if name == "map" else name  # a multi-label run's (configs/multilabel_cpu.yaml)
    accuracy = results[0].get(f"{split}_acc")  # what a classifier's user reads, whatever chose the checkpoint
    also = f" (accuracy {accuracy:.4f})" if accuracy is not None and name != "accuracy" else ""
    note = f" (no test split is held out: {no_test}; val chose this checkpoint, so this figure flatters it)" \
        if no_test else ""
    cli.say(f"{split} {name} of {best or 'the final weights'}: {value:.4f}{also}{note}")
