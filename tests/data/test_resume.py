"""The shuffled training loader of class folders (`vit.data.resume`): the same batches in any worker, an epoch
resumed mid-way at the next batch bit for bit (per DDP rank), and the steps' draws seeded from the batch count."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.formats import write_class_folders
from vit.data import ImageFolder
from vit.data.resume import EpochOrder


@pytest.fixture(autouse=True)
def no_run_seed(monkeypatch):
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # a fit earlier in this process leaves its seed: 0 here


@pytest.fixture
def folder(tmp_path):
    write_class_folders(tmp_path, ["a", "b"], per_class=13, size=12)
    return tmp_path


def datamodule(folder, num_workers=0, rank=0, world=1, state=None) -> ImageFolder:
    dm = ImageFolder(str(folder), img_size=8, batch_size=4, num_workers=num_workers, hflip=0.5, scale=(0.3, 1.0))
    dm.trainer = SimpleNamespace(global_rank=rank, world_size=world, training=True, current_epoch=0)
    dm.setup("fit")
    if state is not None:
        dm.load_state_dict(state)
    return dm


def epoch(loader, number: int | None) -> list[list[torch.Tensor]]:
    if number is not None:
        loader.sampler.set_epoch(number)  # as Lightning does, except for a resumed run's first epoch
    return list(loader)


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


def test_the_order_is_distributed_samplers_and_any_worker_draws_the_same_batches(folder):
    dm = datamodule(folder)
    loader = dm.train_dataloader()
    one = epoch(loader, 1)
    expected = _shuffle(len(dm.train_set), seed=0, epoch=1)
    assert torch.cat([b[1] for b in one]).tolist() == [dm.train_set.labels[i] for i in expected]
    assert same(one, epoch(datamodule(folder, num_workers=2).train_dataloader(), 1))  # 2 workers: the same
    assert not same(one, epoch(loader, 2))  # another epoch: another order and other draws


def _shuffle(n: int, seed: int, epoch: int) -> list[int]:
    """torch's DistributedSampler shuffle of one replica (Lightning's under DDP): randperm seeded seed + epoch."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


@pytest.mark.parametrize("world", [1, 2])
def test_a_restored_position_resumes_each_rank_at_its_next_batch_bitwise(folder, world):
    for rank in range(world):
        straight = epoch(datamodule(folder, rank=rank, world=world).train_dataloader(), 1)
        state = {"training_position": {"seed": 0, "batches_seen": 7, "position": [1, 2]}}
        resumed = datamodule(folder, num_workers=2, rank=rank, world=world, state=state)
        loader = resumed.train_dataloader()
        assert same(epoch(loader, None), straight[2:])  # no set_epoch first: the position names the epoch
        assert same(epoch(loader, 2), epoch(datamodule(folder, rank=rank, world=world).train_dataloader(), 2))
    shards = [torch.cat([b[1] for b in epoch(datamodule(folder, rank=r, world=2).train_dataloader(), 0)])
              for r in range(2)]
    n = len(datamodule(folder).train_set)
    assert len(shards[0]) == len(shards[1]) == -(-n // 2)  # each rank its half


def test_the_position_is_taken_at_the_first_sample_not_at_iter(folder):
    """A loader with workers calls iter(sampler) twice before its first batch and reads the second (torch 2.14.1);
    the resumed epoch must not be spent on the first."""
    state = {"training_position": {"seed": 0, "batches_seen": 7, "position": [1, 2]}}
    sampler = datamodule(folder, state=state).train_dataloader().sampler
    assert isinstance(sampler, EpochOrder)
    iter(sampler)  # the first, discarded iterator
    rest = list(sampler)
    n = len(datamodule(folder).train_set)
    assert rest == [(1, i) for i in _shuffle(n, seed=0, epoch=1)[2 * 4:]]


def test_the_steps_are_counted_and_their_draws_seeded_by_the_count(folder):
    dm = datamodule(folder)
    batch = [torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2)]
    dm.train_dataloader()
    draws = []
    for _ in range(3):
        dm.on_after_batch_transfer(batch, 0)
        draws.append(torch.rand(1))
    assert dm.state_dict()["training_position"] == {"seed": 0, "batches_seen": 3, "position": [0, 3]}
    dm.trainer.num_training_batches = 3  # the epoch is done: saved as the next one's start
    assert dm.state_dict()["training_position"]["position"] == [1, 0]
    again = datamodule(folder, state={"training_position": {"seed": 0, "batches_seen": 2, "position": [0, 2]}})
    again.train_dataloader()
    again.on_after_batch_transfer(batch, 0)
    assert torch.equal(torch.rand(1), draws[2])  # the third step draws what it drew in the first run


def test_a_position_resumes_in_its_epoch_until_the_epochs_last_batch_is_done():
    from vit.data.resume import resume_point

    assert resume_point((3, 0), batches=5) == (3, 0)
    assert resume_point((3, 4), batches=5) == (3, 4)  # one batch left: the same epoch
    assert resume_point((3, 5), batches=5) == (4, 0)  # all done: the next epoch's start


def test_epoch_order_starts_after_the_restored_batches_in_the_restored_epoch():
    from vit.data.resume import EpochOrder

    order = EpochOrder(10, 3, seed=1, resume=lambda: (2, 1))  # epoch 2, one batch of 3 done
    order.set_epoch(7)  # what Lightning may have said before the restore: the position wins
    assert list(order) == [(2, i) for i in _shuffle(10, seed=1, epoch=2)[3:]]
    fresh = EpochOrder(10, 3, seed=1)
    fresh.set_epoch(7)
    assert list(fresh) == [(7, i) for i in _shuffle(10, seed=1, epoch=7)]
