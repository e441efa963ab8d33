"""Bitwise mid-epoch resume of a map-style training loader (class folders, labels files, Hugging Face tables).

```
EpochOrder (a DistributedSampler): epoch e's shuffle of (seed, e), this rank's shard ─► (e, index), ...
    └ resumed: the saved epoch, from the sample after the last batch trained on
SeededSamples: item (e, index) ─► the image's draws (crop, flip, RandAugment) seeded from (seed, e, index)
on_after_batch_transfer (`vit.data.base`): the device's and the model's draws (erasing, mixup, drop path) seeded
    from (seed, rank, batches so far), as the streamed loaders do (`vit.data.stream`)
```
So what a step trains on is a function of the seed and the step alone, in any worker and after any restart:
nothing hangs on the generators' states when the loaders were built or the workers started. The position, the
seed and the batch count travel in the DataModule's state (the checkpoint); Lightning restores it before it builds
the loaders. ``seed`` is `vit fit`'s ``seed_everything`` (``PL_GLOBAL_SEED``), as for Lightning's own
DistributedSampler, so a DDP run shuffles as it did before, and every seed of an experiment draws its own batches.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler, get_worker_info

from vit.data.seeds import mixed_seed, seed_transform

_LABELLED = 0x1AB  # keeps labelled image i's draws apart from pool image i's (`vit.data.pool`), at equal seeds


def run_seed() -> int:
    """The run's seed: the one `seed_everything` exported (0 without one)."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def resume_point(position: tuple[int, int], batches: int) -> tuple[int, int]:
    """(epoch, first batch) to resume at after ``position`` (epoch, batches done in it): a finished epoch resumes
    at the next one's start."""
    epoch, done = position
    return (epoch + 1, 0) if done >= batches else (epoch, done)


class EpochOrder(DistributedSampler):
    """(epoch, index) for every training sample of an epoch on this rank, in DistributedSampler's order
    (shuffled by seed + epoch, sharded, padded), starting after ``resume()``'s (epoch, batches done), if any.

    A DistributedSampler, so Lightning leaves it in place under DDP and calls ``set_epoch`` each epoch; but it
    reads the resumed epoch from the position, since Lightning (2.6) builds a resumed run's first iterator
    before it calls ``set_epoch``."""

    def __init__(self, size: int, batch_size: int, *, seed: int, rank: int = 0, world: int = 1,
                 resume: Callable[[], tuple[int, int] | None] = lambda: None) -> None:
        super().__init__(range(size), num_replicas=world, rank=rank, shuffle=True, seed=seed)
        self.batch_size, self.resume = batch_size, resume

    def __iter__(self) -> Iterator[tuple[int, int]]:
        # A generator, so the position is taken at the first sample asked for: a loader with workers calls iter()
        # twice and reads the second (`vit.data.pool.PoolSampler.__iter__` says where)
        position, start = self.resume(), 0
        if position is not None:
            self.epoch, start = resume_point(position, -(-self.num_samples // self.batch_size))
        epoch = self.epoch
        for i in list(super().__iter__())[start * self.batch_size:]:
            yield epoch, i


class SeededSamples(Dataset):
    """``dataset`` read by (epoch, index): each sample's transform draws from generators seeded by (seed, epoch,
    index), so any worker, or the main process after a restart, draws the same crop and augmentation."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]) -> Any:
        epoch, index = item
        with kept_rng(get_worker_info() is None):  # in the main process: leave training's generators alone
            seed_transform(mixed_seed(self.seed, _LABELLED, epoch, index))
            return self.dataset[index]


@contextmanager
def kept_rng(keep: bool = True) -> Iterator[None]:
    """Python's, NumPy's and torch's CPU generators as they were before the block (when ``keep``)."""
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state()) if keep else None
    try:
        yield
    finally:
        if saved is not None:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])


class TrainingPosition:
    """What a DataModule keeps in the checkpoint to resume its map-style training loader mid-epoch: the run's seed,
    the training batches so far, and (epoch, batches done in it) after the last batch trained on."""

    def __init__(self) -> None:
        self.seed: int | None = None  # fixed when the first loader is built, or by the checkpoint
        self.batches_seen = 0
        self.position: tuple[int, int] | None = None
        self.pending: tuple[int, int] | None = None  # a restored position, for the next loader's first iteration

    def loader_seed(self) -> int:
        if self.seed is None:
            self.seed = run_seed()
        return self.seed

    def take(self) -> tuple[int, int] | None:
        """The restored position, once (later iterations start their epoch at its start)."""
        pending, self.pending = self.pending, None
        return pending

    def step(self, epoch: int, rank: int) -> int:
        """Count a training batch of ``epoch``; the seed of its device and model draws (rank ``rank``)."""
        done = self.position[1] if self.position is not None and self.position[0] == epoch else 0
        self.position = (epoch, done + 1)
        self.batches_seen += 1
        return mixed_seed(self.loader_seed(), rank, self.batches_seen - 1)

    def state_dict(self, batches: int | None) -> dict[str, Any]:
        """The state (``batches``: the trainer's batches an epoch, so a finished epoch is saved as the next's start)."""
        position = self.position
        if position is not None and batches:
            position = resume_point(position, batches)
        return {"seed": self.loader_seed(), "batches_seen": self.batches_seen,
                "position": None if position is None else list(position)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed, self.batches_seen = int(state["seed"]), int(state["batches_seen"])
        position = state.get("position")
        self.position = self.pending = tuple(position) if position is not None else None
