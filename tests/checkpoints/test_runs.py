"""Run folders (`vit.checkpoints.runs`): a new run takes the number after the largest, and the run that saved a
checkpoint last comes first."""

from __future__ import annotations

import os

from vit.checkpoints.runs import new_run_folder, run_checkpoint_folders


def test_a_new_run_is_numbered_one_past_the_largest_as_lightning_numbers_them(tmp_path):
    assert new_run_folder(tmp_path / "exp") == tmp_path / "exp" / "version_0"  # none yet: made with its parents
    for name in ("version_1", "version_10", "version_x", "notes"):
        (tmp_path / "exp" / name).mkdir()
    assert new_run_folder(tmp_path / "exp") == tmp_path / "exp" / "version_11"  # 10 sorts after 1 as a number
    assert (tmp_path / "exp" / "version_11").is_dir()


def test_the_run_that_saved_last_comes_first_and_folders_without_checkpoints_last(tmp_path):
    for run, mtime in (("version_0", 200), ("version_1", 100), ("version_2", None)):
        folder = tmp_path / run / "checkpoints"
        folder.mkdir(parents=True)
        if mtime is not None:
            (folder / "last.ckpt").write_bytes(b"")
            os.utime(folder / "last.ckpt", (mtime, mtime))
    (tmp_path / "version_3").mkdir()  # no checkpoints folder: not a run that saved
    assert run_checkpoint_folders(tmp_path) == [tmp_path / f"version_{i}" / "checkpoints" for i in (0, 1, 2)]
