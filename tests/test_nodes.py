"""`vit fit` as two one-process nodes on localhost (torchrun, gloo), as on a cluster: the digits and streaming
shards. One world-size line, one effective-lr line (scaled by the global batch across nodes), one test report,
one last.ckpt."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import CONFIGS
from tests.conftest import free_port, subprocess_env
from tests.formats import write_class_folders
from tests.helpers import TINY_DIM

pytestmark = pytest.mark.slow


def two_nodes(tmp_path: Path, *args: str) -> str:
    """Run `vit fit ARGS` as node 0 and node 1 of a 2-node torchrun job on this machine; both outputs, joined."""
    port = free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                "--master_addr", "127.0.0.1", "--master_port", str(port)]
    fit = ["-m", "vit", "fit", *args, "--trainer.num_nodes=2", "--trainer.devices=1", "--trainer.strategy=ddp",
           "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
           f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}/logs",
           f"--checkpoint.dirpath={tmp_path}/ckpt"]
    env = subprocess_env(OMP_NUM_THREADS="1")
    nodes = [subprocess.Popen([*torchrun, "--node_rank", str(rank), *fit], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for rank in (1, 0)]
    outputs = [node.communicate(timeout=400)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(output[-3000:] for output in outputs[::-1])
    return "\n".join(outputs)


def check_one_run(output: str, tmp_path: Path, lr: float, batch: int, steps: int) -> None:
    """Each report once, the lr scaled by the 2-node global batch (lr_base_batch = one node's batch), one
    last.ckpt whose optimiser ran at that lr."""
    assert len(re.findall(r"world size 2: 2 nodes x 1 processes each \(DDPStrategy\)", output)) == 1, output[-3000:]
    effective = re.findall(r"effective lr ([0-9.e+-]+) = .* global batch (\d+) / optim\.lr_base_batch (\d+)", output)
    assert len(effective) == 1 and effective[0][1:] == (str(2 * batch), str(batch))
    assert float(effective[0][0]) == pytest.approx(2 * lr, rel=1e-3)
    assert len(re.findall(r"test accuracy of", output)) == 1
    (last,) = list(tmp_path.rglob("last.ckpt"))
    checkpoint = torch.load(last, weights_only=False)
    assert checkpoint["global_step"] == steps
    head = checkpoint["optimizer_states"][0]["param_groups"][-1]
    assert head["initial_lr"] == pytest.approx(2 * lr)  # what the optimiser was given, not only what was printed


@pytest.mark.processes
def test_digits_on_two_nodes(tmp_path):
    output = two_nodes(
        tmp_path, "--config", str(CONFIGS / "digits.yaml"), "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2",
        "--model.init_args.optim.lr_base_batch=64",
    )
    check_one_run(output, tmp_path, lr=0.004, batch=64, steps=3)


@pytest.mark.processes
def test_streaming_shards_on_two_nodes(tmp_path):
    from vit.data.shards import write_shards

    write_class_folders(tmp_path / "photos", ["a", "b"], per_class=50, size=24)
    write_shards(tmp_path / "photos", tmp_path / "shards", num_workers=1)
    output = two_nodes(  # 100 images, split 80/10/10: val and test get 5 a rank, one batch of 4
        tmp_path, "--config", str(CONFIGS / "shards_cpu.yaml"), f"--data.init_args.root={tmp_path / 'shards'}",
        "--data.init_args.batch_size=4", "--data.init_args.num_workers=0", "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=3",
        f"--model.init_args.model_kwargs={{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2}}",
        "--model.init_args.optim.lr_base_batch=4",
        "--checkpoint.every_n_train_steps=3",  # the recipe's 20: none in 3 steps
    )
    check_one_run(output, tmp_path, lr=1e-3, batch=4, steps=3)
