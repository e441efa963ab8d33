"""What ``--ckpt_path`` names (`vit.cli.ckpt_path`): best and last found in a run's folders, a damaged last.ckpt
named (or the newest intact one taken on request), a missing file named beside those that exist."""

from __future__ import annotations

import os

import pytest
import torch

from vit.checkpoints.io import DamagedCheckpointError
from vit.cli.ckpt_path import check_checkpoint_exists, model_task, resolve_last, resolved_path
from vit.errors import UserPathError


def run_folder(tmp_path, *names):
    """A checkpoint folder holding ``names``, written in order (the last named is the newest)."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for i, name in enumerate(names):
        torch.save({"epoch": i, "global_step": 10 * i}, folder / name)
        os.utime(folder / name, (1_000_000 + i, 1_000_000 + i))
    return folder


def config(folder, ckpt_path="last", **more):
    return {"ckpt_path": ckpt_path, "checkpoint": {"dirpath": str(folder)}, **more}


def damage(path):
    path.write_bytes(path.read_bytes()[:40])  # a save cut short: no zip directory at the end


def test_last_is_the_intact_last_checkpoint(tmp_path):
    folder = run_folder(tmp_path, "best-epoch=0.ckpt", "last.ckpt")
    said = []
    assert resolve_last(config(folder), said.append) == str(folder / "last.ckpt") and not said


def test_a_damaged_last_is_named_with_the_way_out_and_nothing_is_resumed(tmp_path):
    folder = run_folder(tmp_path, "best-epoch=0.ckpt", "last.ckpt")
    damage(folder / "last.ckpt")
    with pytest.raises(DamagedCheckpointError, match=r"(?s)last\.ckpt.*--resume_from_readable true"):
        resolve_last(config(folder), print)


def test_asked_to_it_falls_back_to_the_newest_intact_checkpoint_and_says_so(tmp_path):
    folder = run_folder(tmp_path, "epoch=0.ckpt", "best-epoch=1.ckpt", "last.ckpt")
    damage(folder / "last.ckpt")
    said = []
    found = resolve_last(config(folder, resume_from_readable=True), said.append)
    assert found == str(folder / "best-epoch=1.ckpt")  # the newest of the intact ones, not the oldest
    assert len(said) == 1 and "falling back" in said[0] and "epoch 1, step 10" in said[0]


def test_with_nothing_intact_the_fall_back_is_an_error_too(tmp_path):
    folder = run_folder(tmp_path, "last.ckpt")
    damage(folder / "last.ckpt")
    with pytest.raises(DamagedCheckpointError):
        resolve_last(config(folder, resume_from_readable=True), print)


def test_resolved_path_finds_best_and_last_and_says_nothing_for_none(tmp_path):
    folder = run_folder(tmp_path, "best-epoch=0.ckpt", "last.ckpt")
    assert resolved_path(config(folder, "best")) == str(folder / "best-epoch=0.ckpt")
    assert resolved_path(config(folder, "last")) == str(folder / "last.ckpt")
    assert resolved_path(config(tmp_path / "empty", "best")) == ""
    assert resolved_path(config(folder, "elsewhere.ckpt")) == "elsewhere.ckpt"  # a file: as given


def test_a_missing_file_is_named_beside_the_checkpoints_that_exist(tmp_path):
    folder = run_folder(tmp_path, "last.ckpt")
    with pytest.raises(UserPathError, match=r"(?s)gone\.ckpt.*last\.ckpt"):
        check_checkpoint_exists(config(folder, str(tmp_path / "gone.ckpt")))
    for name in ("last", "best", "hpc", "s3://bucket/a.ckpt", str(folder / "last.ckpt")):  # Lightning's, or there
        check_checkpoint_exists(config(folder, name))


@pytest.mark.parametrize(("class_path", "task"), [
    ("vit.tasks.ImageClassifier", "classify"), ("ImageClassifier", "classify"),
    ("vit.tasks.DistilledClassifier", "classify"), ("vit.tasks.ContrastiveTask", "contrastive"),
    ("vit.tasks.MaskedAutoencoder", "pretrain"), ("vit.tasks.Translator", "translate"),
    ("my_package.Mine", None), ("torch.nn.Linear", None),
])
def test_the_configured_models_task_is_the_registrys(class_path, task):
    assert model_task(class_path) == task
