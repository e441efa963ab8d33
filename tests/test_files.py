"""`vit.files`: an output path checked before any work, a save that a failure leaves the old file after, and the
cache folder. (save_atomic's fsyncs and file modes: tests/checkpoints/test_io.py, through checkpoints.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from vit.files import cache_dir, out_problem, save_atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    path = save_atomic(lambda f: f.write(b"old"), tmp_path / "out" / "a.bin")  # makes the folder
    assert path.read_bytes() == b"old"

    def fails(f) -> None:
        f.write(b"half of the new")
        raise KeyboardInterrupt  # as a Ctrl-C in the middle of the write

    with pytest.raises(KeyboardInterrupt):
        save_atomic(fails, path)
    assert path.read_bytes() == b"old" and [p.name for p in path.parent.iterdir()] == ["a.bin"]
    save_atomic(lambda f: f.write(b"new"), path)
    assert path.read_bytes() == b"new" and [p.name for p in path.parent.iterdir()] == ["a.bin"]


def test_an_output_is_checked_against_what_is_on_disk_for_both_kinds(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.csv").write_text("x")
    assert out_problem(tmp_path / "new" / "p.csv", "file") is None  # a new folder is made
    assert out_problem(tmp_path / "file.csv", "file") is None  # overwritten
    assert out_problem(tmp_path / "folder", "file") == (f"{tmp_path / 'folder'} is a folder; name a file in it, "
                                                        f"e.g. {tmp_path / 'folder' / 'predictions.csv'}")
    assert out_problem(tmp_path / "file.csv" / "p.csv", "file") == (
        f"{tmp_path / 'file.csv'} is a file, so {tmp_path / 'file.csv' / 'p.csv'} cannot be created under it")
    assert out_problem(tmp_path / "folder", "folder") is None and out_problem(tmp_path / "export", "folder") is None
    file_given = out_problem(tmp_path / "file.csv", "folder")
    assert file_given == f"{tmp_path / 'file.csv'} is a file; name a folder to write into"
    assert "looks like a file name" in out_problem(tmp_path / "model.onnx", "folder")


def test_the_cache_is_under_xdg_cache_home_or_else_the_home_folders_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir("features", "x") == tmp_path / "vit" / "features" / "x"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "vit" and isinstance(cache_dir(), Path)
