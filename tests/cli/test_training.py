"""Long runs lose nothing and hide nothing: kills, damaged checkpoints, exact resume, NaNs, mismatches."""

from __future__ import annotations

import csv
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.plugins import MixedPrecision
from torch.utils.data import DataLoader, TensorDataset

from tests import CONFIGS
from tests.conftest import short_digits_run, subprocess_env
from tests.dummies import CrashAtStep
from tests.helpers import TINY_DIM, quick_trainer
from vit.checkpoints.io import DamagedCheckpointError, save_checkpoint
from vit.cli.main import cli
from vit.cli.training import (
    AtomicCheckpointIO,
    EpochEndResume,
    RandomState,
    StepFloor,
    TrainingReport,
    floor_epochs,
)
from vit.commands import main
from vit.commands import run as run_vit  # raises what main turns into `error: ...` and exit 1
from vit.deploy import load_classifier
from vit.tasks import ImageClassifier

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
STEPS = 4  # optimiser steps per epoch in these runs


def epochs_run(root: Path, *extra: str, epochs: int = 4) -> list[str]:
    """A tiny digits run of ``epochs`` epochs of STEPS steps, one thread (bitwise reproducible)."""
    return [*short_digits_run(root, steps=STEPS), f"--trainer.max_epochs={epochs}", "--test_after_fit=false",
            "--num_threads=1", *extra]


def crash_at(step: int) -> list[str]:
    return ["--trainer.callbacks+=tests.dummies.CrashAtStep", f"--trainer.callbacks.init_args.step={step}"]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True, map_location="cpu")["state_dict"]


@pytest.mark.slow
def test_resume_at_an_epoch_boundary_gives_the_uninterrupted_weights_bitwise(tmp_path):
    cli(["fit", *epochs_run(tmp_path / "straight")])
    with pytest.raises(RuntimeError, match="simulated crash"):  # dies in epoch 2, after epoch 1's last.ckpt
        main(["fit", *epochs_run(tmp_path / "resumed"), *crash_at(2 * STEPS + 1)])
    assert torch.load(tmp_path / "resumed" / "ckpt" / "last.ckpt", weights_only=True)["epoch"] == 1
    cli(["fit", *epochs_run(tmp_path / "resumed"), "--ckpt_path", "last"])
    straight, resumed = weights(tmp_path / "straight/ckpt/last.ckpt"), weights(tmp_path / "resumed/ckpt/last.ckpt")
    assert straight.keys() == resumed.keys()
    differences = {k: (straight[k] - resumed[k]).abs().max().item() for k in straight}
    assert max(differences.values()) == 0.0, {k: v for k, v in differences.items() if v}


def validations(run_dir: Path) -> list[tuple[int, int]]:
    """(epoch, step) of every validation logged under ``run_dir``, over all its runs' metrics.csv, in order."""
    files = sorted(run_dir.rglob("metrics.csv"), key=lambda f: int(f.parent.name.split("_")[-1]))
    return [(int(r["epoch"]), int(r["step"])) for f in files for r in csv.DictReader(f.open()) if r.get("val_loss")]


@pytest.mark.slow
def test_a_run_killed_mid_epoch_trains_every_epoch_on_the_same_lr_schedule_to_the_same_weights(tmp_path):
    """A folder DataModule (the digits), 3 epochs, last.ckpt every 5 steps: a crash at step 7, in the first
    epoch of the two left, resumes from step 5, trains all 3 epochs on the straight run's lr schedule,
    validates each epoch once, and ends with last.ckpt at the final step (12, no multiple of 5), with the
    uninterrupted run's weights bit for bit."""
    lrs = {}
    for name, extra in (("straight", []), ("resumed", crash_at(7))):
        args = [*epochs_run(tmp_path / name, "--checkpoint.every_n_train_steps=5", epochs=3), *extra]
        if extra:
            with pytest.raises(RuntimeError, match="simulated crash at step 7"):
                main(["fit", *args])
            saved = torch.load(tmp_path / name / "ckpt" / "last.ckpt", weights_only=True)
            assert saved["global_step"] == 5 and saved["epoch"] == 1  # saved mid epoch 2 (index 1)
            run = cli(["fit", *epochs_run(tmp_path / name, "--checkpoint.every_n_train_steps=5", epochs=3),
                       "--ckpt_path", "last"])
        else:
            run = cli(["fit", *args])
        assert run.trainer.global_step == 3 * STEPS and run.trainer.current_epoch == 3
        assert torch.load(tmp_path / name / "ckpt" / "last.ckpt", weights_only=True)["global_step"] == 3 * STEPS
        assert [epoch for epoch, _ in validations(tmp_path / name)] == [0, 1, 2]
        rows = csv.DictReader((Path(run.trainer.logger.log_dir) / "metrics.csv").open())
        lrs[name] = {int(r["step"]): float(r["lr-AdamW/decay"]) for r in rows if r.get("lr-AdamW/decay")}
    # and the same weights, bit for bit: the folder loader goes on mid-epoch with the order and draws it had
    straight, resumed = weights(tmp_path / "straight/ckpt/last.ckpt"), weights(tmp_path / "resumed/ckpt/last.ckpt")
    assert [k for k in straight if not torch.equal(straight[k], resumed[k])] == []
    resumed_steps = sorted(lrs["resumed"])
    assert resumed_steps[0] == 5  # the resumed run starts at the saved step, not at 0 or at the epoch start
    assert resumed_steps[-1] == 3 * STEPS - 1
    for step in resumed_steps:
        assert lrs["resumed"][step] == pytest.approx(lrs["straight"][step], rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["onecycle", "cosine"])
def test_a_finished_run_resumed_for_more_epochs_trains_them_on_the_longer_schedule(tmp_path, caplog, schedule):
    """2 epochs, then `--trainer.max_epochs 4 --ckpt_path last`: the run goes on to step 16 with the lr a 4-epoch
    run has at each of steps 8-15, and says the schedule was re-planned. (With onecycle it stopped at step 9:
    torch's OneCycleLR took back the checkpoint's 8-step length.)"""
    options = [f"--model.init_args.optim.schedule={schedule}", "--model.init_args.optim.warmup_epochs=1"]
    lrs = {}
    for name, epochs in (("straight", [4]), ("extended", [2, 4])):
        for i, n in enumerate(epochs):
            with caplog.at_level(logging.INFO):
                run = cli(["fit", *epochs_run(tmp_path / name, *options, epochs=n), *(["--ckpt_path", "last"] * i)])
        assert run.trainer.global_step == 4 * STEPS
        rows = csv.DictReader((Path(run.trainer.logger.log_dir) / "metrics.csv").open())
        lrs[name] = {int(r["step"]): float(r["lr-AdamW/decay"]) for r in rows if r.get("lr-AdamW/decay")}
    assert sorted(lrs["extended"]) == list(range(2 * STEPS, 4 * STEPS))
    for step, lr in lrs["extended"].items():
        assert lr == pytest.approx(lrs["straight"][step], rel=1e-12)
    assert (f"the checkpoint's run planned its lr schedule over {2 * STEPS} optimiser steps, this run over "
            f"{4 * STEPS}") in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize(("validation", "crash", "saved"), [
    ("--trainer.check_val_every_n_epoch=3", 9, 2 * STEPS),  # the MAE recipes validate every 10 or 20 epochs
    ("--trainer.val_check_interval=2", 7, 6),  # twice an epoch: the one after step 6 is mid-epoch
])
def test_last_ckpt_is_written_whatever_the_validation_schedule(tmp_path, validation, crash, saved):
    """Validating every 3rd epoch, a crash in epoch 3 (step 9) left no last.ckpt at all: Lightning's ModelCheckpoint
    saved only after validations. Now it holds step 8, the end of epoch 2; validating twice an epoch, the step of
    the last validation. Resumed, either run validates where the uninterrupted run does and ends at step 20."""
    runs = {}
    for name, extra in (("straight", []), ("resumed", crash_at(crash))):
        args = [*epochs_run(tmp_path / name, validation, epochs=5)]
        if extra:
            with pytest.raises(RuntimeError, match=f"simulated crash at step {crash}"):
                main(["fit", *args, *extra])
            assert torch.load(tmp_path / name / "ckpt" / "last.ckpt", weights_only=True)["global_step"] == saved
            args += ["--ckpt_path", "last"]
        assert cli(["fit", *args]).trainer.global_step == 5 * STEPS
        runs[name] = validations(tmp_path / name)
    assert runs["resumed"] == runs["straight"]


def test_the_best_checkpoint_holds_the_weights_validation_scored_and_last_ckpt_the_final_step(tmp_path, caplog):
    """last.ckpt every 3 of 8 steps. best-*.ckpt is written after a validation, with the weights it scored:
    `vit validate` on it gives its recorded val_loss. (Saved on the step schedule, as Lightning would, it
    held step 6's weights with step 4's score.) last.ckpt holds step 8, and resuming it has nothing to do."""
    args = epochs_run(tmp_path, "--checkpoint.every_n_train_steps=3", "--checkpoint.monitor=val_loss",
                      "--checkpoint.mode=min", epochs=2)
    cli(["fit", *args])
    (best,) = (tmp_path / "ckpt").glob("best-*.ckpt")
    checkpoint = torch.load(best, weights_only=True)
    assert checkpoint["global_step"] in (STEPS, 2 * STEPS)  # an epoch's end, where validation runs
    (state,) = [v for k, v in checkpoint["callbacks"].items() if k.startswith("BestCheckpoint")]
    recorded = state["best_model_score"].item()
    validated = cli(["validate", *args, "--ckpt_path", str(best)]).trainer.callback_metrics["val_loss"].item()
    assert validated == pytest.approx(recorded, rel=1e-6, abs=0)
    last = tmp_path / "ckpt" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 2 * STEPS  # not 6, the schedule's last
    written = last.stat().st_mtime_ns
    with caplog.at_level(logging.INFO):
        run = cli(["fit", *args, "--ckpt_path", "last"])
    assert run.trainer.global_step == 2 * STEPS and last.stat().st_mtime_ns == written
    assert f"nothing left to train: {last} is the end of this run (epoch 2, step {2 * STEPS})" in caplog.text


class ScriptedScores(LightningModule):
    """A module whose validation scores are given, one per epoch."""

    def __init__(self, scores: list[float], losses: list[float] | None = None) -> None:
        super().__init__()
        self.lin, self.scores, self.losses = torch.nn.Linear(1, 1), scores, losses

    def training_step(self, batch, batch_idx):
        return self.lin(batch[0]).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_acc", self.scores[self.current_epoch])
        if self.losses is not None:
            self.log("val_loss", self.losses[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class CrashesInFirstValidation(ScriptedScores):
    """Validation of epoch 0 fails (a crash, or a kill, while it runs)."""

    def validation_step(self, batch, batch_idx):
        if self.current_epoch == 0:
            raise RuntimeError("simulated crash in validation")
        super().validation_step(batch, batch_idx)


def test_the_step_that_ends_an_epoch_is_saved_after_its_validation(tmp_path):
    """2 epochs of 4 steps, last.ckpt every 2 steps: step 4 ends epoch 0, and is saved after its validation, not
    after the batch (resumed, a checkpoint of an epoch's last batch skips that validation). Validation crashes
    in epoch 0: last.ckpt holds step 2. Without the crash it ends at step 8."""
    from vit.cli.training import LastCheckpoint

    loader = DataLoader(TensorDataset(torch.ones(4, 1)), batch_size=1)

    def fit(module: LightningModule, folder: Path) -> int:
        trainer = Trainer(max_epochs=2, callbacks=[LastCheckpoint(dirpath=str(folder), every_n_train_steps=2)],
                          logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
        trainer.fit(module, loader, loader)
        return torch.load(folder / "last.ckpt", weights_only=True)["global_step"]

    with pytest.raises(RuntimeError, match="simulated crash in validation"):
        fit(CrashesInFirstValidation([0.5, 0.6]), tmp_path / "crashed")
    assert torch.load(tmp_path / "crashed" / "last.ckpt", weights_only=True)["global_step"] == 2
    assert fit(ScriptedScores([0.5, 0.6]), tmp_path / "whole") == 8


def test_best_is_the_runs_best_checkpoint_when_save_top_k_keeps_several(tmp_path):
    """With checkpoint.save_top_k 3 the newest best-*.ckpt is epoch 3's (0.8), the third-best score; `--ckpt_path
    best` and `teacher: best` mean epoch 1's (0.9). A second run in the folder: its own best. A filename of the
    user's, without "best-": still the best."""
    from vit.checkpoints.io import newest_checkpoint
    from vit.cli.training import BestCheckpoint

    loader = DataLoader(TensorDataset(torch.ones(2, 1)), batch_size=2)

    def run(folder: Path, scores: list[float], top_k: int, filename: str = "best-{epoch}-{step}") -> None:
        keep = BestCheckpoint(dirpath=folder, filename=filename, monitor="val_acc", mode="max", save_top_k=top_k)
        Trainer(max_epochs=len(scores), callbacks=[keep], logger=False, enable_progress_bar=False,
                enable_model_summary=False).fit(ScriptedScores(scores), loader, loader)

    run(tmp_path, [0.5, 0.9, 0.7, 0.8], top_k=3)
    saved = sorted(p.name for p in tmp_path.glob("best-*.ckpt"))  # the top 3: epochs 1, 2 and 3
    assert saved == ["best-epoch=1-step=2.ckpt", "best-epoch=2-step=3.ckpt", "best-epoch=3-step=4.ckpt"]
    assert newest_checkpoint(tmp_path, "best") == tmp_path / "best-epoch=1-step=2.ckpt"
    assert newest_checkpoint(tmp_path, "last") is None
    time.sleep(0.01)  # a later run, whose files are newer
    run(tmp_path, [0.6, 0.4], top_k=-1)  # every epoch kept: best-epoch=0-step=1.ckpt (0.6), ...=1-step=2-v1 (0.4)
    assert newest_checkpoint(tmp_path, "best") == tmp_path / "best-epoch=0-step=1.ckpt"  # not the first run's 0.9

    run(tmp_path / "own", [0.3, 0.9, 0.6], top_k=2, filename="{epoch}-{val_acc:.1f}")
    own = sorted(p.name for p in (tmp_path / "own").iterdir())
    assert own == ["epoch=1-val_acc=0.9.ckpt", "epoch=2-val_acc=0.6.ckpt"]  # the newest is epoch 2's
    assert newest_checkpoint(tmp_path / "own", "best") == tmp_path / "own" / "epoch=1-val_acc=0.9.ckpt"


@pytest.mark.parametrize(("scores", "losses", "tie_break", "top_k", "kept"), [
    ([0.9, 0.8, 0.9, 0.9], [0.5, 0.4, 0.3, 0.35], "val_loss", 1, [2]),  # equal val_acc: the lowest val_loss
    ([0.9, 0.8, 0.9, 0.9], [0.5, 0.4, 0.6, 0.5], "val_loss", 1, [0]),  # a tie with a higher (or equal) loss keeps
    ([0.9, 0.8, 0.9, 0.9], [0.5, 0.4, 0.3, 0.35], None, 1, [0]),  # no tie_break: Lightning's first of equals
    ([0.7, 0.9, 0.9, 0.8], [0.1, 0.5, 0.4, 0.05], "val_loss", 1, [2]),  # a better score wins whatever its loss;
    ([0.9, 0.8, 0.9], None, "val_loss", 1, [0]),  # no val_loss logged: the first of equals, no error
    ([0.9, 0.9, 0.9], [0.5, 0.3, 0.1], "val_loss", 2, [0, 1]),  # several kept: Lightning's rule, untouched
])
def test_a_tie_on_the_monitor_goes_to_the_lower_val_loss(tmp_path, scores, losses, tie_break, top_k, kept):
    """On a 120-image validation split val_acc repeats; Lightning kept the first of equal scores (a texture run
    kept epoch 0, test 0.787, over epoch 21's equal val_acc at a far lower val loss, test 0.95). A tie is judged
    against the kept checkpoint's loss, not the last one's."""
    from vit.cli.training import BestCheckpoint

    loader = DataLoader(TensorDataset(torch.ones(1, 1)), batch_size=1)
    keep = BestCheckpoint(dirpath=tmp_path, filename="best-{epoch}", monitor="val_acc", mode="max", save_top_k=top_k,
                          tie_break=tie_break)
    Trainer(max_epochs=len(scores), callbacks=[keep], logger=False, enable_progress_bar=False,
            enable_model_summary=False).fit(ScriptedScores(scores, losses), loader, loader)
    assert sorted(p.name for p in tmp_path.glob("best-*.ckpt")) == [f"best-epoch={k}.ckpt" for k in kept]
    if top_k == 1:
        assert keep.tie_value == (pytest.approx(losses[kept[0]]) if tie_break and losses else None)


def test_a_resumed_run_breaks_ties_against_the_kept_checkpoints_loss(tmp_path):
    """Killed after epoch 1 and resumed: epoch 2 ties epoch 1's val_acc with a higher loss than epoch 1's (0.3)
    but lower than epoch 0's (0.5): kept only if the tie value was lost with the process."""
    from vit.cli.training import BestCheckpoint, LastCheckpoint

    loader = DataLoader(TensorDataset(torch.ones(1, 1)), batch_size=1)
    module = ScriptedScores([0.8, 0.9, 0.9], [0.5, 0.3, 0.4])

    def fit(epochs: int, resume: str | None = None) -> BestCheckpoint:
        keep = BestCheckpoint(dirpath=tmp_path, filename="best-{epoch}", monitor="val_acc", mode="max")
        Trainer(max_epochs=epochs, callbacks=[keep, LastCheckpoint(dirpath=str(tmp_path))], logger=False,
                enable_progress_bar=False, enable_model_summary=False).fit(module, loader, loader, ckpt_path=resume)
        return keep

    assert fit(2).tie_value == pytest.approx(0.3)
    keep = fit(3, str(tmp_path / "last.ckpt"))
    assert [p.name for p in tmp_path.glob("best-*.ckpt")] == ["best-epoch=1.ckpt"]
    assert keep.tie_value == pytest.approx(0.3)


@pytest.mark.processes
@pytest.mark.slow
def test_sigkill_during_vit_fit_then_resume_finishes_every_epoch(tmp_path):
    """A real `vit fit` process killed with SIGKILL mid-run, then `--ckpt_path last`. 15 epochs: the kill lands
    epochs before the end even where an epoch takes tens of ms, and the resume (in this process) is short."""
    epochs = 15
    args = [*epochs_run(tmp_path, epochs=epochs), "--trainer.limit_val_batches=1"]
    child = subprocess.Popen([sys.executable, "-m", "vit", "fit", *args], env=subprocess_env(), cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = tmp_path / "ckpt" / "last.ckpt"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and not (last.is_file() and torch.load(
                last, weights_only=True)["epoch"] >= 2):
            time.sleep(0.2)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    saved = torch.load(last, weights_only=True)
    assert 2 <= saved["epoch"] < epochs - 1
    run = cli(["fit", *args, "--ckpt_path", "last"])
    assert run.trainer.current_epoch == epochs and run.trainer.global_step == epochs * STEPS
    # It went on from the killed step, not from step 0: it trained exactly the steps the killed run had left.
    rows = csv.DictReader((Path(run.trainer.logger.log_dir) / "metrics.csv").open())
    trained = sorted(int(r["step"]) for r in rows if r.get("lr-AdamW/decay"))  # logged at every step
    assert trained == list(range(saved["global_step"], epochs * STEPS))


def test_vit_fit_writes_every_checkpoint_through_the_atomic_checkpoint_io(tmp_path, monkeypatch):
    """`vit fit` installs AtomicCheckpointIO, and the best and last checkpoints are saved by it."""
    saved = []

    def recording_save(checkpoint: dict, path) -> Path:
        saved.append(Path(path).name)
        return save_checkpoint(checkpoint, path)

    monkeypatch.setattr("vit.cli.training.save_checkpoint", recording_save)  # what AtomicCheckpointIO calls
    run = cli(["fit", *epochs_run(tmp_path, epochs=1)])
    assert isinstance(run.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    on_disk = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert on_disk == ["best-epoch=0-step=4.ckpt", "last.ckpt"] and sorted(set(saved)) == on_disk


def damaged_last(tmp_path: Path) -> Path:
    main(["fit", *epochs_run(tmp_path, epochs=2), "--trainer.limit_val_batches=2"])
    last = tmp_path / "ckpt" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 3])  # what a kill during a copy leaves
    return last


def test_a_damaged_last_ckpt_is_named_with_the_other_checkpoints(tmp_path):
    last = damaged_last(tmp_path)
    with pytest.raises(DamagedCheckpointError) as err:
        run_vit(["fit", *epochs_run(tmp_path, epochs=3), "--ckpt_path", "last"])
    message = str(err.value)
    assert f"checkpoint {last} is damaged" in message
    assert "best-epoch=" in message and "(epoch " in message and "--resume_from_readable" in message


def test_resume_from_readable_falls_back_to_the_newest_intact_checkpoint(tmp_path, capsys):
    damaged_last(tmp_path)
    best = next((tmp_path / "ckpt").glob("best-*.ckpt"))
    run = cli(["fit", *epochs_run(tmp_path, epochs=3), "--ckpt_path", "last", "--resume_from_readable=true"])
    assert f"is damaged; falling back to the newest intact checkpoint, {best}" in capsys.readouterr().out
    assert run.trainer.current_epoch == 3 and (tmp_path / "ckpt" / "last.ckpt").stat().st_size > 1000


@pytest.mark.slow
def test_a_nan_loss_stops_the_run_naming_step_lr_and_precision(tmp_path):
    poison = ["--trainer.callbacks+=tests.dummies.PoisonBatch", f"--trainer.callbacks.init_args.step={STEPS + 2}"]
    stop = rf"loss is nan at step {STEPS + 2} \(lr [\d.e-]+, precision 32-true\)"
    with pytest.raises(FloatingPointError, match=stop):
        main(["fit", *epochs_run(tmp_path, epochs=2), *poison])
    last = tmp_path / "ckpt" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == STEPS  # the epoch before the NaN
    classifier = load_classifier(last)  # and it loads, with finite weights
    assert all(torch.isfinite(p).all() for p in classifier.parameters())


def test_fp16_steps_the_grad_scaler_skips_are_counted_and_reported(tmp_path, caplog):
    class InfGradientAtStep2(ImageClassifier):
        def on_after_backward(self) -> None:
            if self.global_step == 2:
                for p in self.parameters():
                    if p.grad is not None:
                        p.grad.fill_(float("inf"))

    model = InfGradientAtStep2(model="vit_digits_patch2_8", model_kwargs=dict(depth=1, embed_dim=TINY_DIM, num_heads=2))
    data = DataLoader(TensorDataset(torch.randn(40, 1, 8, 8), torch.arange(40) % 10), batch_size=8)
    report = TrainingReport()
    trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[report],
                      plugins=[MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))])
    with caplog.at_level(logging.WARNING, logger="vit.cli.training"):
        trainer.fit(model, data)
    assert report.skipped_steps == 1 and "step 2: gradients were not finite" in caplog.text
    assert trainer.callback_metrics["skipped_steps"] == 1
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the skipped step changed nothing


def test_a_checkpoint_of_another_model_or_task_is_a_clear_error(tmp_path, fitted):
    best = str(next((fitted / "ckpt").glob("best-*.ckpt")))
    shapes = tmp_path / "shapes"
    from tests.formats import write_class_folders

    write_class_folders(shapes, ["circle", "square", "star"], per_class=4, size=16)
    folder = ["--data=vit.data.ImageFolder", f"--data.root={shapes}", "--data.img_size=16", "--data.num_workers=0",
              "--data.val_fraction=0.25", "--trainer.max_epochs=1", "--trainer.logger=false",
              f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"]
    with pytest.raises(ValueError, match=r"written for vit_digits_patch4_16 with 10 classes, this run builds "
                                         r"vit_digits_patch4_16 with 3 classes.*num_classes: checkpoint 10"):
        run_vit(["fit", "--config", str(CONFIGS / "digits.yaml"), *folder, "--data.init_args.batch_size=4",
              f"--model.init_args.model_kwargs={{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2}}", "--ckpt_path", best])



@pytest.mark.slow
def test_a_translator_checkpoint_given_to_an_image_recipe_is_a_clear_error(tmp_path):
    from vit.data import SyntheticTranslationDataModule
    from vit.tasks import Translator

    data = SyntheticTranslationDataModule("copy", num_train=64, num_val=8, num_test=8, batch_size=16)
    model = Translator(data.tokenizers, embed_dim=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1)
    trainer = quick_trainer(tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(model, datamodule=data)
    translator = tmp_path / "translator.ckpt"
    trainer.save_checkpoint(translator)
    with pytest.raises(ValueError, match=r"--ckpt_path .*translator\.ckpt holds the Translator task \('translate'\), "
                                         r"but the ImageClassifier task \('classify'\) is needed here"):
        run_vit(["fit", *short_digits_run(tmp_path / "run"), "--ckpt_path", str(translator)])
    with pytest.raises(ValueError, match=r"the checkpoint holds the Translator task \('translate'\), but the "
                                         r"ImageClassifier task \('classify'\) is needed here"):
        ImageClassifier.load_from_checkpoint(translator, weights_only=True)


def test_other_ranks_resume_on_their_own_streams_derived_from_rank_0s():
    """Under DDP the checkpoint holds rank 0's generators: rank 0 resumes them exactly, others reseed by rank."""
    from types import SimpleNamespace

    def draws() -> tuple:
        return random.random(), float(np.random.rand()), tuple(torch.rand(3).tolist())

    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    saved = RandomState().state_dict()
    expected = draws()  # what rank 0 draws after the save, in the uninterrupted run
    after = {}
    for rank in (0, 1, 2, 1):
        callback = RandomState()
        callback.setup(SimpleNamespace(global_rank=rank), None, "fit")
        torch.manual_seed(123), np.random.seed(123), random.seed(123)  # whatever the process drew before
        callback.load_state_dict(saved)
        drawn = draws()
        assert after.setdefault(rank, drawn) == drawn  # the same checkpoint, the same streams
    assert after[0] == expected
    assert len({after[0], after[1], after[2]}) == 3  # no two ranks alike


class _Tiny(LightningModule):
    """A linear model on 12 random rows, batch 4: 3 optimiser steps an epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(12, 2, generator=torch.Generator().manual_seed(0))), batch_size=4)


class _SaveAt(Callback):
    """A checkpoint after optimiser step ``step``, at that batch's end or, where ``epoch_end``, at the epoch's end
    (as `LastCheckpoint` saves one)."""

    def __init__(self, path: Path, step: int, epoch_end: bool) -> None:
        self.path, self.step, self.epoch_end = path, step, epoch_end

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.epoch_end and trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.epoch_end and trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


@pytest.mark.parametrize(("step", "epoch_end"), [(3, True), (2, False), (4, False)])
@pytest.mark.parametrize("connector", ["ours", "lightning"])
def test_a_checkpoint_resumes_every_step_left_with_max_steps_set(tmp_path, step, epoch_end, connector):
    """3 epochs of 3 steps with a max_steps far off. A checkpoint of epoch 0's end must resume at epoch 1's first
    step: lightning 2.6.6 reruns that epoch's end instead, counts the epoch twice and trains fewer than 9 (the
    bug `EpochEndResume` mends; this test fails on the "lightning" side once Lightning fixes it, and the class can
    go). Checkpoints inside an epoch (before its last batch, either side of the boundary) are Lightning's own."""
    ckpt = tmp_path / "saved.ckpt"
    trainer = quick_trainer(tmp_path, max_epochs=3, max_steps=100, callbacks=[_SaveAt(ckpt, step, epoch_end),
                                                                               CrashAtStep(5)])
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.fit(_Tiny())
    assert torch.load(ckpt, weights_only=False)["global_step"] == step

    resumed = quick_trainer(tmp_path, max_epochs=3, max_steps=100)
    if connector == "ours":
        resumed._checkpoint_connector = EpochEndResume(resumed)
    resumed.fit(_Tiny(), ckpt_path=ckpt)
    if connector == "lightning" and epoch_end:  # the upstream bug, pinned
        assert resumed.global_step < 9 and resumed.current_epoch == 3
    else:
        assert (resumed.global_step, resumed.current_epoch) == (9, 3)


def test_an_epoch_cut_short_by_max_steps_resumes_at_its_next_batch(tmp_path):
    """max_steps 2 ends epoch 0 after 2 of its 3 batches; its end's checkpoint, resumed with a larger max_steps,
    must go on at that epoch's third batch (Lightning's own resume, which `EpochEndResume` leaves alone), not
    skip it as a finished epoch's end would."""
    ckpt, batches = tmp_path / "saved.ckpt", []
    quick_trainer(tmp_path, max_epochs=3, max_steps=2, callbacks=[_SaveAt(ckpt, 2, epoch_end=True)]).fit(_Tiny())

    class Seen(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            batches.append((trainer.current_epoch, batch_idx))

    resumed = quick_trainer(tmp_path, max_epochs=3, max_steps=100, callbacks=[Seen()])
    resumed._checkpoint_connector = EpochEndResume(resumed)
    resumed.fit(_Tiny(), ckpt_path=ckpt)
    assert batches[:2] == [(0, 2), (1, 0)]


# ---- StepFloor: more epochs on a small training set ---------------------------------------------------------
@pytest.mark.parametrize(("epochs", "per_epoch", "min_steps", "cap", "expected"), [
    (40, 10, 400, 4, 40),   # exactly min_steps: as written
    (40, 11, 400, 4, 40),   # over
    (40, 9, 400, 4, 45),    # 360 steps: 400 / 9 = 44.4, so 45 epochs (405 steps)
    (40, 3, 400, 4, 134),   # 400 / 3 = 133.3: 134 epochs, under the cap of 160
    (40, 2, 400, 4, 160),   # 200 epochs would reach it: capped at 4 x 40
    (40, 1, 400, 2.5, 100),  # a fractional cap: 2.5 x 40
    (3, 1, 400, 4, 12),
])
def test_floor_epochs_reaches_min_steps_within_the_cap(epochs, per_epoch, min_steps, cap, expected):
    assert floor_epochs(epochs, per_epoch, min_steps, cap) == expected


class _Planned(LightningModule):
    """A linear model on ``rows`` random rows, batch 4, that records the steps its schedule is planned over."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows, self.layer, self.planned = rows, torch.nn.Linear(2, 1), None

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        self.planned = self.trainer.estimated_stepping_batches
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        rows = torch.randn(self.rows, 2, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(rows), batch_size=4)


@pytest.mark.parametrize(("rows", "epochs", "steps"), [
    (24, 2, 12),  # 6 steps an epoch x 2 = 12 = min_steps: as written
    (20, 3, 15),  # just under: 5 x 2 = 10 < 12, so 3 epochs (15 steps)
    (4, 8, 8),    # 1 step an epoch: 12 epochs would reach it, capped at 4 x 2
])
def test_step_floor_sets_the_epochs_before_the_schedule_is_planned(tmp_path, rows, epochs, steps):
    trainer = quick_trainer(tmp_path, max_epochs=2, callbacks=[StepFloor(min_steps=12, max_factor=4)])
    model = _Planned(rows)
    trainer.fit(model)
    assert (trainer.max_epochs, trainer.global_step, model.planned) == (epochs, steps, steps)


def test_step_floor_leaves_a_run_of_max_steps_and_an_unset_floor_alone(tmp_path):
    for floor, max_steps in ((StepFloor(min_steps=12), 5), (StepFloor(), -1)):
        trainer = quick_trainer(tmp_path, max_epochs=2, max_steps=max_steps, callbacks=[floor])
        trainer.fit(_Planned(4))
        assert trainer.max_epochs == 2 and floor.chosen is None


def floor_run(root: Path, *extra: str) -> list[str]:
    """A tiny digits run of 2 steps an epoch whose epochs come from a config file (1) and the step floor
    (min_steps 7, at most 5x): 4 epochs, 8 steps, unless the command line names the epochs."""
    from tests.conftest import quiet_run

    config = root / "floor.yaml"
    root.mkdir(parents=True, exist_ok=True)
    config.write_text("trainer:\n  max_epochs: 1\nstep_floor:\n  min_steps: 7\n  max_factor: 5\n")
    run = [a for a in short_digits_run(root, steps=2) if a != "--trainer.max_epochs=1"]
    return [*run, *quiet_run(root, str(config))[0:2], "--test_after_fit=false", "--num_threads=1", *extra]


def test_vit_fit_trains_the_floors_epochs_and_says_why(tmp_path, capsys, caplog):
    with caplog.at_level(logging.INFO):
        run = cli(["fit", *floor_run(tmp_path)])
    assert (run.trainer.max_epochs, run.trainer.global_step) == (4, 8)
    assert ("step_floor: 2 optimiser steps an epoch x trainer.max_epochs 1 = 2 steps, under step_floor.min_steps 7: "
            "training 4 epochs (8 steps)") in caplog.text + capsys.readouterr().out


@pytest.mark.parametrize("given", [["--trainer.max_epochs=2"], ["--trainer.max_epochs", "2"],
                                   ["--trainer.max_steps=3"]])
def test_epochs_or_steps_on_the_command_line_win_over_the_floor(tmp_path, capsys, given):
    run = cli(["fit", *floor_run(tmp_path, *given)])
    expected = (2, 4) if "max_epochs" in given[0] else (1, 2)  # max_steps 3 within 1 epoch of 2 steps: 2
    assert (run.trainer.max_epochs, run.trainer.global_step) == expected
    assert f"step_floor: off ({given[0].split('=')[0]} given on the command line" in capsys.readouterr().out


@pytest.mark.parametrize("saves", [[], ["--checkpoint.every_n_train_steps=1"]])
def test_a_run_resumed_under_the_floor_trains_the_same_epochs_on_the_same_schedule(tmp_path, saves):
    """Killed in epoch 2 (of the floor's 4; the config says 1), resumed from last.ckpt of epoch 1's end (step 4) or,
    with a save every step, of step 5 (epoch 2's first of 2 batches): the same 4 epochs, the same schedule, the
    same weights bitwise."""
    cli(["fit", *floor_run(tmp_path / "straight", *saves)])
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(["fit", *floor_run(tmp_path / "resumed", *saves), *crash_at(6 if saves else 5)])
    assert torch.load(tmp_path / "resumed/ckpt/last.ckpt", weights_only=True)["global_step"] == (5 if saves else 4)
    resumed = cli(["fit", *floor_run(tmp_path / "resumed", *saves), "--ckpt_path", "last"])
    assert (resumed.trainer.max_epochs, resumed.trainer.global_step) == (4, 8)
    plans = [torch.load(tmp_path / run / "ckpt" / "last.ckpt", weights_only=False)["vit"]["schedule_steps"]
             for run in ("straight", "resumed")]
    assert plans == [8, 8]
    straight, again = weights(tmp_path / "straight/ckpt/last.ckpt"), weights(tmp_path / "resumed/ckpt/last.ckpt")
    assert max((straight[k] - again[k]).abs().max().item() for k in straight) == 0.0


def test_a_step_floor_out_of_range_is_a_users_error_naming_its_key():
    from vit.cli.training import StepFloor
    from vit.errors import UserValueError

    with pytest.raises(UserValueError,
                       match=r"step_floor\.min_steps must be a positive number of steps or null, not 0$"):
        StepFloor(min_steps=0)
    with pytest.raises(UserValueError, match=r"step_floor\.max_factor must be 1 or more, not 0\.99"):
        StepFloor(min_steps=1, max_factor=0.99)
    assert (StepFloor(min_steps=1, max_factor=1).min_steps, StepFloor().min_steps) == (1, None)  # the other sides
