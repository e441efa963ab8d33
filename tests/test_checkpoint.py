"""Checkpoint files: atomic writes that survive SIGKILL, damaged files named with their neighbours."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import subprocess_env, umask
from vit.checkpoint import (
    DamagedCheckpointError,
    describe_checkpoints,
    is_intact,
    read_checkpoint,
    save_checkpoint,
)
from vit.training import AtomicCheckpointIO

# A child that saves a small checkpoint, then a large one (about 400 MB) through the given writer, over and over.
WRITER = textwrap.dedent("""
    import sys, torch
    from vit.training import AtomicCheckpointIO
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
