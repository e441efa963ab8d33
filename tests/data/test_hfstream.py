"""Streaming Hugging Face rows (vit.data.hfstream, HFDataset(streaming=True)): every worker and every DDP rank yields
its own rows, each row once per epoch (the trap of `datasets` 5.0, whose shuffled iterable feeds worker 0 alone, would
fail here), the same batches whatever the number of workers, and a `vit fit` SIGKILLed mid-epoch resumes bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import Dataset, get_worker_info

from tests import CONFIGS
from tests.conftest import free_port, subprocess_env
from tests.data.hf_formats import dataset, digits, write_parquet
from tests.helpers import TINY_DIM
from vit.data.hfstream import ArrowStream, StreamLoader
from vit.data.hub import HFDataset

pytest.importorskip("datasets")


class RowsAndWorkers(Dataset):
    """Item i is (i, the id of the worker that read it): what a batch says about who yielded which row."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        info = get_worker_info()
        return i, info.id if info is not None else -1


def epochs_of(loader, n: int) -> list[list[tuple[list[int], list[int]]]]:
    return [[(rows.tolist(), workers.tolist()) for rows, workers in loader] for _ in range(n)]


def test_two_workers_both_yield_rows_and_every_row_comes_once_per_epoch_as_one_process_orders_them():
    stream = ArrowStream(RowsAndWorkers(38), seed=3, batch_size=4)
    two = epochs_of(StreamLoader(stream, num_workers=2), 2)
    one = epochs_of(StreamLoader(ArrowStream(RowsAndWorkers(38), seed=3, batch_size=4), num_workers=0), 2)
    for epoch, (batches, alone) in enumerate(zip(two, one)):
        rows = [r for b, _ in batches for r in b]
        assert sorted(rows) == list(range(38)), epoch  # every row, once
        assert {w for _, ws in batches for w in ws} == {0, 1}  # both workers yielded rows
        assert [b for b, _ in batches] == [b for b, _ in alone]  # the batches of one process, in its order
    assert two[0][0][0] != two[1][0][0]  # a new order each epoch
    resumed = StreamLoader(ArrowStream(RowsAndWorkers(38), seed=3, batch_size=4), num_workers=2)
    resumed.resume = (0, 3)  # three batches of epoch 0 trained: on from the fourth, then epoch 1 whole
    rest, after = epochs_of(resumed, 2)
    assert [b for b, _ in rest] == [b for b, _ in two[0][3:]] and [b for b, _ in after] == [b for b, _ in two[1]]


def stream_on_a_rank(rank: int, world: int, port: int, root: str, out: str) -> None:
    """One DDP rank (gloo on localhost): HFDataset streaming with 2 workers; writes 2 epochs of (rows, workers)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        data = HFDataset(root, img_size=8, batch_size=4, num_workers=2, streaming=True)
        data.setup("fit")
        data.train_set.dataset = RowsAndWorkers(len(data.train_set.dataset))  # (rows named by their index)
        data.trainer = SimpleNamespace(global_rank=dist.get_rank(), world_size=dist.get_world_size(), training=False)
        Path(out, f"rank{rank}.json").write_text(json.dumps(epochs_of(data.train_dataloader(), 2)))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ddp_ranks_with_two_workers_each_read_every_row_once_per_epoch_in_equal_batch_counts(tmp_path):
    images, labels = digits(10)  # 100 rows: 80 train, 40 a rank, 10 batches of 4 a rank
    write_parquet(tmp_path / "p", {"train": dataset(images, labels, [str(i) for i in range(10)])})
    torch.multiprocessing.start_processes(stream_on_a_rank, args=(2, free_port(), str(tmp_path / "p"), str(tmp_path)),
                                          nprocs=2, start_method="fork")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in range(2):
        batches = [ranks[r][epoch] for r in range(2)]
        assert len(batches[0]) == len(batches[1]) == 10
        rows = [row for r in batches for b, _ in r for row in b]
        assert sorted(rows) == list(range(80))  # every row once, over both ranks
        for r in batches:
            assert {w for _, ws in r for w in ws} == {0, 1}  # both workers of each rank yielded rows
    assert ranks[0][0] != ranks[0][1]


def _fit(tmp_path: Path, run: str, *extra: str) -> list[str]:
    return ["fit", "--config", str(CONFIGS / "shards_cpu.yaml"), "--data", "vit.data.HFDataset",
            f"--data.init_args.root={tmp_path / 'p'}", "--data.init_args.streaming=true",
            "--data.init_args.batch_size=8", "--data.init_args.num_workers=2", "--trainer.max_epochs=2",
            "--checkpoint.every_n_train_steps=3", "--test_after_fit=false", "--num_threads=1",
            f"--model.init_args.model_kwargs={{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2, drop_path_rate: 0.1}}",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={tmp_path / run}", f"--trainer.logger.init_args.save_dir={tmp_path / run}",
            f"--checkpoint.dirpath={tmp_path / run}/ckpt", *extra]


@pytest.mark.processes
@pytest.mark.slow
def test_a_streamed_run_sigkilled_mid_epoch_resumes_to_the_same_weights_bit_for_bit(tmp_path):
    """`vit fit` streaming 48 training rows (6 batches of 8 an epoch, 2 workers), SIGKILLed at step 4 and resumed
    from last.ckpt (step 3) in a new process: the weights and optimiser state of an uninterrupted run."""
    from tests.data.test_stream import _assert_same_end
    from vit.cli.main import cli

    images, labels = digits(6)
    part = lambda keep: dataset([x for i, x in enumerate(images) if keep(i)], [y for i, y in enumerate(labels)
                                                                             if keep(i)], [str(i) for i in range(10)])
    write_parquet(tmp_path / "p", {"train": part(lambda i: i % 5), "validation": part(lambda i: not i % 5)})
    env = subprocess_env(PYTHONPATH=str(CONFIGS.parent))

    def fit(run: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "vit", *_fit(tmp_path, run, *extra)], env=env,
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)

    cli(_fit(tmp_path, "whole"))
    killed = fit("killed", "--trainer.callbacks+=tests.killer.KillAt", "--trainer.callbacks.init_args.step=4")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert torch.load(tmp_path / "killed/ckpt/last.ckpt", weights_only=False)["global_step"] == 3
    resumed = fit("killed", "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    whole = torch.load(tmp_path / "whole/ckpt/last.ckpt", weights_only=False)
    assert whole["global_step"] == 12
    _assert_same_end(whole, torch.load(tmp_path / "killed/ckpt/last.ckpt", weights_only=False))
