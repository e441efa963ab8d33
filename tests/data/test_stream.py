"""Streaming the shards (`vit.data.stream`, ImageShards): uint8 batches finished on the device, draws that depend on
seed, epoch and index alone, a saved position that resumes at the next batch, DDP ranks that see every sample
once, and runs killed mid-epoch that resume to the same weights."""

from __future__ import annotations

import csv
import itertools
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from lightning.pytorch import Callback

from tests import CONFIGS
from tests.conftest import free_port, subprocess_env
from tests.data.conftest import OPTS
from tests.formats import write_class_folders
from tests.helpers import TINY_DIM
from vit.data.shards import write_shards
from vit.data.stream import ImageShards
from vit.errors import UserPathError, UserValueError


def test_the_datamodule_streams_uint8_batches_and_finishes_them_on_the_device(sharded):
    _, out, info = sharded
    dm = ImageShards(str(out), num_workers=2, batch_size=4, **OPTS)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert len(batches) == info["splits"]["train"] // 4  # the remainder (< one batch) sits the epoch out
    x, y = batches[0]
    assert x.dtype == torch.uint8 and x.shape == (4, 3, 16, 16) and y.dtype == torch.int64
    finished = dm.batch_transform(x, erase=False)
    mean = torch.tensor(dm.mean).view(1, 3, 1, 1)
    std = torch.tensor(dm.std).view(1, 3, 1, 1)
    torch.testing.assert_close(finished, (x.float() / 255 - mean) / std)
    val = list(dm.val_dataloader())
    assert sum(len(y) for _, y in val) == info["splits"]["val"] and val[0][0].dtype == torch.float32


def _draws(out: Path, seed: int = 0, epoch: int = 1, order: str = "forward") -> dict[int, torch.Tensor]:
    """Each training sample's transformed image, read by index in ``order``, with the global RNGs stirred."""
    dm = ImageShards(str(out), num_workers=0, **{**OPTS, "seed": seed})
    dm.setup("fit")
    train = dm.train_set
    train.set_epoch(epoch)
    indices = list(range(len(train)))
    if order != "forward":
        indices = indices[::-1]
    result = {}
    for i in indices:
        torch.rand(i + 1), np.random.rand(i + 1)  # whatever the RNGs held before must not matter
        result[i] = train[i][0]
    return result


def test_a_samples_draws_depend_on_seed_epoch_and_index_alone(sharded):
    """What exact resume rests on: a training sample's crop, flip and RandAugment come from (seed, epoch, index)
    alone, whichever order, worker or process draws it; another epoch or seed draws anew."""
    _, out, info = sharded
    forward = _draws(out)
    backward = _draws(out, order="backward")
    assert all(torch.equal(forward[i], backward[i]) for i in forward)
    for other in (_draws(out, epoch=2), _draws(out, seed=1)):
        assert sum(not torch.equal(forward[i], other[i]) for i in forward) >= len(forward) - 1

    def epoch_of(num_workers: int) -> list[tuple[bytes, int]]:  # one epoch's samples as (pixels, label), sorted
        dm = ImageShards(str(out), num_workers=num_workers, batch_size=2, **OPTS)
        dm.setup("fit")
        return sorted((x.numpy().tobytes(), int(y)) for xs, ys in dm.train_dataloader() for x, y in zip(xs, ys))

    one, two = epoch_of(0), epoch_of(2)  # 2 workers split the samples otherwise, in other processes
    assert len(one) == info["splits"]["train"] // 2 * 2 and one == two
    assert sorted(x.numpy().tobytes() for x in forward.values()) == sorted(x for x, _ in one)  # epoch 1 as above


def _next_epoch(loader, batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A new pass over ``loader``, fetched as Lightning (2.6) fetches it: ``batches`` batches, without ever asking
    the iterator for its end (its fetcher stops at the loader's length)."""
    return list(itertools.islice(iter(loader), batches))


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_a_saved_position_resumes_at_the_next_batch_and_the_epochs_after_it_are_whole(sharded, num_workers):
    """What a checkpoint holds of ImageShards (state_dict mid-epoch, or after an epoch's last batch), loaded into a
    new DataModule: it goes on with the batch the uninterrupted one drew next, then draws the same whole epochs."""
    _, out, info = sharded
    batch = 5
    assert info["splits"]["train"] % batch  # a remainder sits each epoch out: the last batch is not the split's end

    def datamodule() -> ImageShards:
        dm = ImageShards(str(out), num_workers=num_workers, batch_size=batch, **OPTS)
        dm.setup("fit")
        return dm

    straight = datamodule()
    loader = straight.train_dataloader()
    n = len(loader)
    epochs, saved = [], {}
    for epoch in range(3):
        epochs.append([])
        for x, y in itertools.islice(iter(loader), n):
            straight.batches_seen += 1  # what on_after_batch_transfer counts in training
            epochs[-1].append((x, y))
            if epoch == 0 and len(epochs[-1]) in (2, n):
                saved[len(epochs[-1])] = straight.state_dict()
    for at, state in saved.items():
        resumed = datamodule()
        resumed.load_state_dict(state)
        loader = resumed.train_dataloader()
        assert resumed.batches_seen == at
        rest = _next_epoch(loader, n - at) if at < n else []  # after the last batch, Lightning starts the next epoch
        drawn = [rest, _next_epoch(loader, n), _next_epoch(loader, n)]
        for got, want in zip(drawn, [epochs[0][at:], epochs[1], epochs[2]], strict=True):
            assert len(got) == len(want), f"saved after batch {at} of {n}: {[len(e) for e in drawn]} batches"
            assert all(torch.equal(x, wx) and torch.equal(y, wy) for (x, y), (wx, wy) in zip(got, want))


def test_a_training_split_too_small_for_one_whole_batch_is_an_error_not_an_empty_epoch(sharded):
    _, out, info = sharded
    n = info["splits"]["train"]
    shards = ImageShards(str(out), num_workers=0, **{**OPTS, "batch_size": n + 1})
    shards.setup("fit")
    with pytest.raises(UserValueError, match=rf"{n} training images make no whole batch of {n + 1}.*at most {n}"):
        shards.train_dataloader()
    shards = ImageShards(str(out), num_workers=0, **{**OPTS, "batch_size": n})
    shards.setup("fit")
    assert len(shards.train_dataloader()) == 1


def test_an_unreachable_object_store_fails_fast_with_a_clear_message(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there: as offline, but certain
    start = time.perf_counter()
    with pytest.raises(UserPathError, match=r"cannot reach s3://bucket/imagenet: 127.0.0.1:9 does not answer"):
        _ = ImageShards("s3://bucket/imagenet", cache_dir="cache").class_names
    assert time.perf_counter() - start < 10


def _ddp_rank(rank: int, port: int, out: str, result: str) -> None:
    # A rank that torchrun or Lightning starts is a fresh process whose loader workers fork. One started by
    # torch.multiprocessing.spawn inherits "spawn", and each worker re-imported torch: 30 s an epoch here. (The
    # test now forks its ranks too; this keeps the workers' start method whichever way a rank was started.)
    multiprocessing.set_start_method("fork", force=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dm = ImageShards(out, num_workers=2, batch_size=4, img_size=16, auto_augment=None)
    dm.setup("fit")
    loader = dm.train_dataloader()
    epochs = [[y.tolist() for _, y in loader] for _ in range(2)]
    Path(result, f"{rank}.json").write_text(json.dumps(epochs))
    dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_ranks_see_every_sample_once_per_epoch_in_equal_batch_counts(tmp_path):
    # one image per class, so a label names its sample; 2 ranks x batch 4 x 4 batches + 3 left over
    folder = tmp_path / "photos"
    for split, n in (("train", 35), ("val", 1)):
        write_class_folders(folder / split, [f"c{i:02d}" for i in range(n)], per_class=1, size=16)
    write_shards(folder, tmp_path / "out", num_workers=1)
    torch.multiprocessing.start_processes(_ddp_rank, args=(free_port(), str(tmp_path / "out"), str(tmp_path)),
                                          nprocs=2, start_method="fork")  # a spawned rank re-imports torch: seconds
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    orders = []
    for epoch in range(2):
        batches = [ranks[r][epoch] for r in range(2)]
        assert len(batches[0]) == len(batches[1]) == 4 and all(len(b) == 4 for r in batches for b in r)
        seen = [label for r in batches for b in r for label in b]
        assert len(seen) == len(set(seen)) == 32  # each sample once; 35 - 32 = 3 (< 2 x 4) sit the epoch out
        orders.append(seen)
    assert orders[0] != orders[1]  # a new order each epoch, from the seed and the epoch


def _shards_fit(tmp_path: Path, run: str, *extra: str, workers: int = 2, epochs: int = 3) -> list[str]:
    """`vit fit` of configs/shards_cpu.yaml at reduced size (a 1-block model, batch 8, one thread, last.ckpt
    every 3 steps) on the shards in tmp_path, writing under tmp_path/run."""
    return ["fit", "--config", str(CONFIGS / "shards_cpu.yaml"), f"--data.init_args.root={tmp_path / 'shards'}",
            "--data.init_args.batch_size=8", f"--data.init_args.num_workers={workers}",
            f"--trainer.max_epochs={epochs}",
            "--checkpoint.every_n_train_steps=3", "--test_after_fit=false", "--num_threads=1",
            f"--model.init_args.model_kwargs={{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2, drop_path_rate: 0.1}}",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={tmp_path / run}", f"--trainer.logger.init_args.save_dir={tmp_path / run}",
            f"--checkpoint.dirpath={tmp_path / run}/ckpt", *extra]


def _validations(run: Path) -> list[tuple[str, str, str]]:
    """(epoch, step, val_loss) of every validation logged under ``run``, over all its runs, in order."""
    files = sorted(run.rglob("metrics.csv"), key=lambda f: int(f.parent.name.split("_")[-1]))
    rows = [row for f in files for row in csv.DictReader(f.open())]
    return [(r["epoch"], r["step"], r["val_loss"]) for r in rows if r.get("val_loss")]


def _assert_same_end(a: dict, b: dict) -> None:
    """Two checkpoints at the same step with the same weights (EMA included) and optimiser state, bit for bit."""
    assert a["global_step"] == b["global_step"] and a["state_dict"].keys() == b["state_dict"].keys()
    diff = max((a["state_dict"][k].double() - b["state_dict"][k].double()).abs().max().item() for k in a["state_dict"])
    print(f"largest weight difference after the resumes: {diff}")
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    for x, y in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_run_crashed_in_each_epoch_resumes_to_the_same_weights_and_validations(tmp_path, workers):
    """3 epochs of 6 steps (54 images: a remainder of 6 sits each epoch out), last.ckpt every 3 steps. One run
    crashes five times and is resumed each time: at step 4 (epoch 0, from step 3), in epoch 0's validation (from
    3: step 6 is saved after it), at 7 (just after epoch 0, from 6), 11 (epoch 1, from 9) and 16 (epoch 2, from
    15). It ends with the uninterrupted run's weights bit for bit, at the same step, having validated every epoch
    once (and redone the validation the crash cut short), with the same scores at the same steps."""
    from vit.cli.main import cli
    from vit.commands import main

    write_class_folders(tmp_path / "photos", ["a", "b"], per_class=33, size=20)
    write_shards(tmp_path / "photos", tmp_path / "shards", num_workers=1)  # 54 train
    cli(_shards_fit(tmp_path, "straight", workers=workers))
    in_training, in_validation = "tests.dummies.CrashAtStep", f"{__name__}.CrashInValidation"
    crashes = ((in_training, 4, 3), (in_validation, 6, 3), (in_training, 7, 6), (in_training, 11, 9),
               (in_training, 16, 15))
    for i, (callback, step, saved) in enumerate(crashes):
        crash = [f"--trainer.callbacks+={callback}", f"--trainer.callbacks.init_args.step={step}"]
        with pytest.raises(RuntimeError, match=f"simulated crash (in validation )?at step {step}"):
            main(_shards_fit(tmp_path, "crashed", *crash, *(["--ckpt_path=last"] if i else []), workers=workers))
        assert torch.load(tmp_path / "crashed/ckpt/last.ckpt", weights_only=False)["global_step"] == saved
    run = cli(_shards_fit(tmp_path, "crashed", "--ckpt_path=last", workers=workers))
    assert run.trainer.global_step == 18 and run.trainer.current_epoch == 3
    straight = torch.load(tmp_path / "straight/ckpt/last.ckpt", weights_only=False)
    _assert_same_end(straight, torch.load(tmp_path / "crashed/ckpt/last.ckpt", weights_only=False))
    validated = _validations(tmp_path / "straight")
    assert [epoch for epoch, _, _ in validated] == ["0", "1", "2"]
    # Epoch 0's validation is logged twice: the one the crash cut short (its end was never checkpointed) is redone.
    assert _validations(tmp_path / "crashed") == [validated[0], *validated]


@pytest.mark.processes
@pytest.mark.slow
def test_a_run_sigkilled_in_its_first_epoch_resumes_to_the_same_weights_bit_for_bit(tmp_path):
    """A real `vit fit` process (2 loader workers, as the recipe) SIGKILLed at step 4 of 12, in the first of 2
    epochs, and resumed from last.ckpt (step 3) in a new process: equal weights, EMA and optimiser state to an
    uninterrupted run (in this process: the reference need not be a subprocess, and one start-up less)."""
    from vit.cli.main import cli

    write_class_folders(tmp_path / "photos", ["a", "b"], per_class=30, size=20)
    write_shards(tmp_path / "photos", tmp_path / "shards", num_workers=1)  # 48 train: 6 batches of 8 an epoch
    env = subprocess_env(PYTHONPATH=str(CONFIGS.parent))

    def fit(run: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "vit", *_shards_fit(tmp_path, run, *extra, epochs=2)], env=env,
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)

    cli(_shards_fit(tmp_path, "whole", epochs=2))
    killed = fit("killed", "--trainer.callbacks+=tests.killer.KillAt", "--trainer.callbacks.init_args.step=4")
    assert killed.returncode == -9  # SIGKILL at step 4, in epoch 0; last.ckpt is step 3's
    assert torch.load(tmp_path / "killed/ckpt/last.ckpt", weights_only=False)["global_step"] == 3
    resumed = fit("killed", "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    whole_end = torch.load(tmp_path / "whole/ckpt/last.ckpt", weights_only=False)
    assert whole_end["global_step"] == 12
    _assert_same_end(whole_end, torch.load(tmp_path / "killed/ckpt/last.ckpt", weights_only=False))
    from vit.deploy import load_classifier

    classifier = load_classifier(tmp_path / "killed/ckpt/last.ckpt")  # what predict/export/attention read
    assert classifier.class_names == ["a", "b"] and classifier.img_size == (32, 32)


class CrashInValidation(Callback):
    """Raise at the end of the validation that follows the given optimiser step (a kill during validation)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.global_step == self.step and not trainer.sanity_checking:
            raise RuntimeError(f"simulated crash in validation at step {self.step}")
