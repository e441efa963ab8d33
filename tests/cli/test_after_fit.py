"""What `vit fit` does once trained (`vit.cli.after_fit`): --calibrate read as one word, and the report of the best
checkpoint's test (or, with no test split, val) figure. The calibration itself: tests/commands/test_calibrate.py."""

from __future__ import annotations

import logging
import re

import pytest

from tests.formats import write_class_folders
from vit.cli.after_fit import calibration_mode
from vit.cli.main import cli


@pytest.mark.parametrize(("value", "mode"), [
    ("temperature", "temperature"), (False, None), ("false", None), ("unknown", "unknown"), (True, "unknown"),
    ("true", "unknown"),  # --calibrate true: the old spelling of unknown
])
def test_calibrate_reads_as_one_word(value, mode):
    assert calibration_mode(value) == mode


def test_a_single_folder_holds_out_a_test_split_and_without_one_nothing_is_called_test(tmp_path, capsys, caplog):
    """80/10/10 by default, so `vit fit` reports a test figure from images that chose nothing; with
    test_fraction 0 it reports val, named as val. Chosen by another metric, the report gives it and accuracy."""
    root = tmp_path / "shapes"
    write_class_folders(root, ["circle", "square"], per_class=20, size=16)
    common = [
        "fit", "--seed_everything=0", "--data=vit.data.ImageFolder", f"--data.root={root}", "--data.img_size=16",
        "--data.num_workers=0",
        "--data.batch_size=8", "--model=vit.tasks.ImageClassifier", "--model.model=vit_tiny_patch16_224",
        "--model.model_kwargs={depth: 1, patch_size: 8}", "--trainer.max_epochs=1", "--test_after_fit=true",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1",
    ]
    run = cli([*common, f"--trainer.default_root_dir={tmp_path / 'split'}"])
    sizes = [len(s) for s in (run.datamodule.train_set, run.datamodule.val_set, run.datamodule.test_set)]
    assert sizes == [32, 4, 4]
    test_files = {p for p, _ in run.datamodule.test_set.samples}
    assert not test_files & {p for p, _ in run.datamodule.train_set.samples + run.datamodule.val_set.samples}
    printed = capsys.readouterr().out
    assert "test accuracy of" in printed and "val accuracy" not in printed
    run = cli([*common, "--data.test_fraction=0", f"--trainer.default_root_dir={tmp_path / 'no_test'}"])
    printed = capsys.readouterr().out
    assert "val accuracy of" in printed and "no test split is held out" in printed and "test accuracy" not in printed
    assert "test_acc" not in run.trainer.callback_metrics
    with caplog.at_level(logging.WARNING, logger="vit.data.folder"):  # `vit test` anyway: it says what it tests
        run.trainer.test(run.model, datamodule=run.datamodule)
    assert re.search("no test split is held out .* on the val images", caplog.text)
    # A checkpoint chosen by val_loss: the report names the test loss, and the accuracy beside it.
    capsys.readouterr()
    run = cli([*common, "--checkpoint.monitor=val_loss", "--checkpoint.mode=min",
               f"--trainer.default_root_dir={tmp_path / 'by_loss'}"])
    figures = re.search(r"^test loss of \S+best-\S+: ([\d.]+) \(accuracy ([\d.]+)\)$", capsys.readouterr().out, re.M)
    assert figures, "no 'test loss of ...: L (accuracy A)' line"
    tested = run.trainer.callback_metrics
    assert float(figures.group(1)) == pytest.approx(tested["test_loss"].item(), abs=5e-5)
    assert float(figures.group(2)) == pytest.approx(tested["test_acc"].item(), abs=5e-5)
