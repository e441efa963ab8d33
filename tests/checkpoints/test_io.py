"""Checkpoint files: atomic writes that survive SIGKILL, damaged files named with their neighbours."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import subprocess_env, umask
from vit.checkpoints.io import DamagedCheckpointError, describe_checkpoints, is_intact, read_checkpoint, save_checkpoint
from vit.cli.training import AtomicCheckpointIO

# A child that saves a small checkpoint, then a large one (about 400 MB) through the given writer, over and over.
WRITER = textwrap.dedent("""
    import sys, torch
    from vit.cli.training import AtomicCheckpointIO
    path, how = sys.argv[1], sys.argv[2]
    write = AtomicCheckpointIO().save_checkpoint if how == "atomic" else (lambda c, p: torch.save(c, p))
    write({"version": 1, "w": torch.zeros(10)}, path)
    print("saved", flush=True)
    big = {"version": 2, "w": torch.ones(100_000_000)}
    while True:
        write(big, path)
""")


def kill_during_save(tmp_path: Path, how: str) -> Path:
    """Run the writer, wait until its second save is under way, SIGKILL it; return the checkpoint path."""
    path = tmp_path / "last.ckpt"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(path), how], stdout=subprocess.PIPE, text=True,
                             env=subprocess_env(), cwd=tmp_path)
    try:
        assert child.stdout.readline().strip() == "saved"
        size = path.stat().st_size
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until a partial big file exists (the temp file, or the target itself)
            partial = [p for p in tmp_path.iterdir() if p.is_file() and 1_000_000 < p.stat().st_size < 350_000_000]
            if partial or (how == "plain" and 1_000_000 < path.stat().st_size != size):
                break
            time.sleep(0.002)
        else:
            pytest.fail("the writer never got going")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    return path


@pytest.mark.slow
def test_a_kill_during_an_atomic_save_leaves_the_old_checkpoint(tmp_path):
    path = kill_during_save(tmp_path, "atomic")
    assert is_intact(path)
    assert read_checkpoint(path)["version"] == 1  # the old file, whole; the torn one was only ever a temp file
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob(".last.ckpt.*.tmp"))  # nothing staged in /tmp


@pytest.mark.slow
def test_a_kill_during_a_plain_save_tears_the_file(tmp_path):
    """The control: writing in place, as a plain torch.save does, leaves a damaged file behind."""
    path = kill_during_save(tmp_path, "plain")
    assert not is_intact(path)
    with pytest.raises(DamagedCheckpointError, match=r"last\.ckpt is damaged"):
        read_checkpoint(path)


def test_save_checkpoint_replaces_atomically_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "ckpt" / "model.ckpt"
    save_checkpoint({"epoch": 1, "w": torch.ones(3)}, path)
    save_checkpoint({"epoch": 2, "w": torch.zeros(3)}, path)
    assert read_checkpoint(path)["epoch"] == 2
    assert [p.name for p in path.parent.iterdir()] == ["model.ckpt"]


def test_save_atomic_fsyncs_the_temp_file_before_the_rename_and_the_folder_after_it(tmp_path, monkeypatch):
    """The rename alone survives a SIGKILL; the fsyncs make the file and the rename survive a power cut:
    the data must reach the disk before the rename publishes it, and the rename before the call returns."""
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        calls.append(("fsync", "folder" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino, st.st_size))
        real_fsync(fd)

    def replace(src, dst) -> None:
        calls.append(("replace", Path(src).parent == Path(dst).parent, os.stat(src).st_ino, os.stat(src).st_size))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = tmp_path / "ckpt" / "last.ckpt"
    save_checkpoint({"epoch": 1, "w": torch.ones(1000)}, path)
    written = path.stat()
    assert [c[:2] for c in calls] == [("fsync", "file"), ("replace", True), ("fsync", "folder")]
    (_, _, synced, synced_size), (_, _, renamed, renamed_size), (_, _, folder, _) = calls
    assert synced == renamed == written.st_ino and synced_size == renamed_size == written.st_size  # the whole temp file
    assert folder == path.parent.stat().st_ino  # the checkpoint's own folder, where the rename happened


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_atomic_saves_get_the_umasks_mode_and_keep_a_replaced_files_mode(tmp_path, mask):
    """A temporary file renamed into place is not created 0600 (as mkstemp's are): the umask decides."""
    path = tmp_path / "ckpt" / "last.ckpt"
    with umask(mask) as expected:
        AtomicCheckpointIO().save_checkpoint({"epoch": 1}, path)  # what Lightning calls in `vit fit`
        assert oct(path.stat().st_mode & 0o777) == oct(expected)
        # a mode chosen for the old file survives the next save, as with an overwrite in place
        path.chmod(0o600)
        save_checkpoint({"epoch": 2}, path)
    assert oct(path.stat().st_mode & 0o777) == oct(0o600) and read_checkpoint(path)["epoch"] == 2


def test_a_damaged_checkpoint_is_named_with_the_intact_ones_beside_it(tmp_path):
    for epoch in (1, 2):
        name = f"best-epoch={epoch}-step={10 * epoch}.ckpt"
        save_checkpoint({"epoch": epoch, "global_step": 10 * epoch}, tmp_path / name)
    save_checkpoint({"epoch": 3, "global_step": 30}, tmp_path / "other.ckpt")
    last = tmp_path / "last.ckpt"
    save_checkpoint({"epoch": 4, "global_step": 40, "w": torch.randn(1000)}, last)
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 3])
    with pytest.raises(DamagedCheckpointError) as err:
        read_checkpoint(last)
    message = str(err.value)
    assert f"checkpoint {last} is damaged" in message
    assert "best-epoch=2-step=20.ckpt (epoch 2, step 20)" in message and "other.ckpt (epoch 3, step 30)" in message
    lines = describe_checkpoints(tmp_path)
    assert len(lines) == 4 and any(line.endswith("last.ckpt (damaged)") for line in lines)


def test_the_best_checkpoint_state_is_found_by_the_best_callbacks_own_key():
    from vit.checkpoints.io import best_checkpoint_state
    from vit.cli.training import BestCheckpoint

    state = {"best_model_path": "/run/best-1.ckpt", "best_model_score": 0.9}
    key = BestCheckpoint(monitor="val_acc", mode="max").state_key  # as Lightning keys it in a checkpoint
    assert best_checkpoint_state({"callbacks": {key: state, "LastCheckpoint{}": {"best_model_path": "x"}}}) == state
    assert best_checkpoint_state({"callbacks": {"LastCheckpoint{}": {"best_model_path": "x"}}}) is None
    assert best_checkpoint_state({}) is None
    assert best_checkpoint_state({"callbacks": {key: state, key + "'": state}}) is None  # two: neither is chosen
