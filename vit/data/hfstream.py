"""The training rows of Hugging Face data streamed: an IterableDataset whose every worker and rank yields its own rows,
with exact mid-epoch resume.

```
epoch e: permutation(seed, e) of the N training rows ─► rank r takes every world-th row from r, cut to N // world
   ─► batches of B in order; batch j goes to worker (j - skip) % workers ─► the DataLoader's round robin over its
       workers hands them out as 0, 1, 2, ... whatever the number of workers, so a resumed epoch (skip = batches
       already trained) carries on at the next batch
```
Every worker yields rows (none is left idle, as a `datasets` iterable shuffled in 5.0 leaves all but worker 0); each
row is read by one rank once per epoch, and the fewer than ``world`` rows left over sit out that epoch only (the next
permutation leaves out others). A row's crop and augmentation are seeded from (seed, epoch, row), so they are the
same whichever worker or rank draws them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from vit.data.seeds import mixed_seed, seed_transform


class ArrowStream(IterableDataset):
    """A map-style split's rows as a stream: epoch ``epoch`` from batch ``skip`` on, rank ``rank`` of ``world``."""

    def __init__(self, dataset: Dataset, seed: int, batch_size: int) -> None:
        self.dataset, self.seed, self.batch_size = dataset, seed, batch_size
        self.epoch, self.skip, self.rank, self.world = 0, 0, 0, 1

    def __len__(self) -> int:
        """The rows this rank reads per epoch: the same on every rank."""
        return len(self.dataset) // self.world

    def num_batches(self) -> int:
        """Batches per epoch on each rank (the last may be partial)."""
        return math.ceil(len(self) / self.batch_size)

    def rank_rows(self) -> np.ndarray:
        """The items this rank reads this epoch, in order."""
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.dataset))
        return order[self.rank::self.world][:len(self)]

    def worker_batches(self, worker: int, workers: int) -> list[int]:
        """The batches of this epoch worker ``worker`` of ``workers`` makes: every workers-th one from the resume."""
        return list(range(self.skip + worker, self.num_batches(), workers))

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rows = self.rank_rows()
        for j in self.worker_batches(worker, workers):
            for index in rows[j * self.batch_size:(j + 1) * self.batch_size].tolist():
                seed_transform(mixed_seed(self.seed, self.epoch, index))
                yield self.dataset[index]

    @property
    def labels(self) -> Any:
        """The labels of every item (the map-style split's), without decoding."""
        return self.dataset.labels


class StreamLoader(DataLoader):
    """A DataLoader over an `ArrowStream` that starts each iteration at the next epoch, or at a restored position.

    Its workers are started per iteration (not persistent), so each sees the epoch and position set just before."""

    def __init__(self, stream: ArrowStream, **kwargs: Any) -> None:
        super().__init__(stream, batch_size=stream.batch_size, persistent_workers=False, **kwargs)
        self.resume: tuple[int, int] | None = None  # (epoch, batches done) from a checkpoint
        self.started = False

    def __iter__(self) -> Any:
        stream: ArrowStream = self.dataset
        if self.resume is not None:
            stream.epoch, stream.skip = self.resume
            if stream.skip >= stream.num_batches():  # saved after the epoch's last batch: the next epoch follows
                stream.epoch, stream.skip = stream.epoch + 1, 0
            self.resume = None
        elif self.started:
            stream.epoch, stream.skip = stream.epoch + 1, 0
        self.started = True
        return super().__iter__()
