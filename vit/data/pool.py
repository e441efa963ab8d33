"""An unlabelled pool beside labelled images: ``--data.init_args.unlabelled_root DIR`` (images anywhere below it).

```
DIR ─► find_images (recursive) ─► header check (as the labelled splits') ─► PoolImages: one whole batch per item,
     each image's draws seeded from (seed, pass, index) ─► one uint8 tensor per view ─► BatchTransform per view
training step: {"labelled": [images, labels], "unlabelled": [view_0, view_1, ...]}   (Lightning's CombinedLoader)
```
The task says which views it wants with ``unlabelled_views`` (a tuple of "train", "weak", "strong" or
`Augmentation` settings): every view is drawn from the same decoded image, in order, so two views of one
image are two augmentations of it (FixMatch's weak and strong), and one view is what teacher and student
both see (function matching). A task without ``unlabelled_views`` is refused a pool, in one line.

How much of the pool each step reads: by default every pool image once per epoch (each rank's shard split
into as many batches as the labelled loader has); with ``unlabelled_ratio`` r, ``round(r * batch_size)``
pool images a step, a stream of passes over the pool (each a fresh permutation) that runs across epochs.
Either way the pool batch of (epoch, batch) is a function of the seed alone: the sampler starts a resumed
epoch at the batch after the last one the model saw (saved in the checkpoint), and each image's crop and
ops are seeded from (seed, pass, index), so a resumed run reads the same pool batches, bit for bit, in any
worker. Under DDP each rank reads its own shard of every pass's permutation (padded to equal length).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import CombinedLoader, rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, get_worker_info

from vit.data import transforms
from vit.data.fast import collate
from vit.data.files import ImageFiles, check_headers
from vit.data.io import describe_bad_files, find_images, require_folder
from vit.data.resume import kept_rng, resume_point
from vit.data.seeds import mixed_seed, seed_transform
from vit.data.transforms import Augmentation
from vit.errors import UserValueError

log = logging.getLogger(__name__)

# Named views a task may ask for; "train" is the DataModule's own training augmentation.
WEAK = Augmentation(auto_augment=None, re_prob=0.0, hflip=0.5, color_jitter=0.0, scale=(0.6, 1.0))
STRONG = Augmentation(auto_augment="rand-m10-n2-mstd0.5-inc1", re_prob=1.0, hflip=0.5, color_jitter=0.0,
                      scale=(0.3, 1.0))
VIEWS = {"weak": WEAK, "strong": STRONG}


def pool_files(root: str | Path) -> list[str]:
    """Every image file below ``root``, at any depth; a missing folder or one without images is one line."""
    root = Path(root).expanduser()
    require_folder(root)
    try:
        found = find_images([root])
    except UserValueError:
        raise UserValueError(f"unlabelled_root {root} holds no image files; give a folder with images "
                             "(any depth), or leave --data.init_args.unlabelled_root out") from None
    for line in found.describe_skipped():
        log.warning(line)
    return [str(path) for path in found.files]


class PoolImages:
    """The pool's images, one whole batch per item: ``pool[(epoch, batch, [(pass, index), ...])]`` ->
    ``[view_0 (B, C, H, W) uint8, ..., position (3,) int64]`` (position: epoch, batch, worker id; the
    DataModule strips it on the device). Decoding, its bad-file replacement and counts are `ImageFiles`'s."""

    def __init__(self, images: Any, num_views: int, seed: int) -> None:
        self.images, self.num_views, self.seed = images, num_views, seed  # images: `ImageFiles` of `views_of`

    def __len__(self) -> int:
        return len(self.images)

    def replacements(self) -> tuple[int, list[str]]:
        return self.images.replacements()

    def _views(self, pass_: int, index: int) -> tuple[Tensor, ...]:
        seed_transform(mixed_seed(self.seed, pass_, index))
        views, _ = self.images[index]
        return views if self.num_views > 1 else (views,)

    def __getitem__(self, item: tuple[int, int, list[tuple[int, int]]]) -> list[Tensor]:
        epoch, batch, members = item
        worker = get_worker_info()
        with kept_rng(worker is None):  # in the main process: leave training's RNGs alone
            drawn = [self._views(p, i) for p, i in members]
        stacked = [collate([(d[v], 0) for d in drawn])[0] for v in range(self.num_views)]
        return [*stacked, torch.tensor([epoch, batch, worker.id if worker else -1])]


def views_of(transforms: Sequence[Callable]) -> Callable:
    """One transform for the pool's dataset: the view itself when there is one (FastTrainTransform then decodes a
    large JPEG at a fraction of its size), else all views of one decoded image, in order."""
    return transforms[0] if len(transforms) == 1 else _Views(transforms)


class _Views:
    """Several worker-side transforms of one decoded image, in order."""

    def __init__(self, views: Sequence[Callable]) -> None:
        self.views = list(views)

    def __call__(self, img: Any) -> tuple[Tensor, ...]:
        return tuple(view(img) for view in self.views)


def _unbatched(item: Any) -> Any:
    """The DataLoader's collate for whole-batch items: the item as it is."""
    return item


class PoolSampler(DistributedSampler):
    """(epoch, batch, [(pass, index), ...]) for each of ``batches`` pool batches of an epoch, on this rank.

    A DistributedSampler, so Lightning leaves it in place under DDP (it shards by itself) and calls
    ``set_epoch`` each epoch. ``resume()`` gives (epoch, next batch) once after a restore, or None.
    """

    def __init__(self, size: int, batches: int, *, seed: int, rank: int = 0, world: int = 1,
                 pool_batch: int | None = None, resume: Callable[[], tuple[int, int] | None] = lambda: None) -> None:
        super().__init__(range(size), num_replicas=world, rank=rank, shuffle=True, seed=seed)
        self.size, self.batches, self.pool_batch, self.resume = size, batches, pool_batch, resume
        self.shard_size = math.ceil(size / world)
        self._shard = lru_cache(maxsize=4)(self._make_shard)

    def __len__(self) -> int:
        return self.batches

    def _make_shard(self, pass_: int) -> list[int]:
        """This rank's share of pass ``pass_``'s permutation, padded by wrapping to ``shard_size``."""
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(mixed_seed(self.seed, pass_)))
        order = order.tolist()
        order += order[: self.shard_size * self.num_replicas - self.size]
        return order[self.rank::self.num_replicas]

    def members(self, epoch: int, batch: int) -> list[tuple[int, int]]:
        """The (pass, index) pairs of pool batch ``batch`` of ``epoch``."""
        if self.pool_batch is None:  # one pass an epoch, split evenly over the batches
            shard = self._shard(epoch)
            lo, hi = batch * self.shard_size // self.batches, (batch + 1) * self.shard_size // self.batches
            return [(epoch, i) for i in shard[lo:hi]]
        first = (epoch * self.batches + batch) * self.pool_batch
        return [(q // self.shard_size, self._shard(q // self.shard_size)[q % self.shard_size])
                for q in range(first, first + self.pool_batch)]

    def __iter__(self) -> Any:
        # A generator: the restored position is taken at the first batch asked for, not at iter(). With workers, a
        # DataLoader's first iterator calls iter(sampler) twice and reads the second (torch 2.14.1:
        # _BaseDataLoaderIter.__init__, then _MultiProcessingDataLoaderIter's _reset): an eager __iter__ spent the
        # position on the first, and the resumed epoch restarted at its batch 0 (FunctionMatching, 2 workers).
        # The epoch from the restored position, not from set_epoch: Lightning (2.6) builds a resumed run's first
        # iterator before its set_epoch, and the epoch-0 pass it then read was empty at an epoch boundary.
        resume, start = self.resume(), 0
        if resume is not None:
            self.epoch, start = resume_point(resume, self.batches)
        epoch = self.epoch
        for b in range(start, self.batches):
            yield epoch, b, self.members(epoch, b)


def view_settings(view: str | Augmentation, own: Augmentation) -> Augmentation:
    """The augmentation of a named view ("train": the DataModule's own; "weak", "strong"), or the one given."""
    if view == "train":
        return own
    if not isinstance(view, Augmentation) and view not in VIEWS:
        raise UserValueError(f"unknown unlabelled view {view!r}: use 'train', 'weak', 'strong' or an Augmentation")
    view = view if isinstance(view, Augmentation) else VIEWS[view]
    # data.hflip 0 says a mirrored image is another class (digits, text): the pool's views keep it off too
    return view if own.hflip else dataclasses.replace(view, hflip=0.0)


class UnlabelledPool:
    """What an image DataModule needs for an unlabelled pool beside its labelled training split: a mixin before
    `ImageDataModule` (`ImageFolder` and the DataModules built on it), set up by ``init_pool`` in ``__init__``.
    The files are read as the labelled ones are (`vit.data.files`): headers checked at setup, and undecodable files
    replaced with ``skip_bad_images``."""

    unlabelled_root: Path | None = None
    unlabelled_ratio: float | None = None

    def init_pool(self, root: str | None, ratio: float | None) -> None:
        if ratio is not None and ratio <= 0:
            raise UserValueError(f"unlabelled_ratio must be positive (pool images per labelled image), got {ratio}")
        self.unlabelled_root = Path(root).expanduser() if root else None
        self.unlabelled_ratio = ratio
        self.pool_files: list[str] | None = None
        self._pool_next: tuple[int, int] | None = None  # (epoch, next batch) after the last pool batch trained on
        self._pool_resume: tuple[int, int] | None = None  # the same, from a checkpoint, for the next iteration
        self._pool_device: list[Callable] = []

    def setup_pool(self) -> list[str]:
        """The pool's files, found and header-checked once (bad files: an error, or left out with skip_bad_images)."""
        if self.pool_files is None:
            files = pool_files(self.unlabelled_root)
            bad = dict(check_headers(files, self.eval_short_side())) if self.check_images else {}
            if bad:
                report = describe_bad_files(sorted(bad.items()), len(files))
                if not self.skip_bad_images:
                    raise UserValueError(f"{self.unlabelled_root}: {report}\nRemove or fix them, or set "
                                         "data.skip_bad_images: true to train without them.")
                log.warning("%s: leaving out %s", self.unlabelled_root, report)
                files = [f for f in files if f not in bad]
            rank_zero_info(f"{self.unlabelled_root}: {len(files)} unlabelled images")
            self.pool_files = files
        return self.pool_files

    def pool_views(self) -> list[Augmentation]:
        """The views the training task asks for (its ``unlabelled_views``); a task that reads none is an error."""
        task = getattr(self.trainer, "lightning_module", None)
        views = getattr(task, "unlabelled_views", None)
        if not views:
            raise UserValueError(f"{type(task).__name__} trains on labelled images only: leave out "
                                 "data.unlabelled_root, or use a task that reads the pool (vit.tasks.FunctionMatching)")
        return [view_settings(v, self.augmentation) for v in views]

    def pool_loader(self, labelled_batches: int) -> DataLoader:
        """The pool's loader: ``labelled_batches`` batches an epoch, on this rank, from any restored position."""
        files = self.setup_pool()
        views = self.pool_views()
        worker = [transforms.train_transform(v, self.img_size, self.interpolation, self.mean, self.std) for v in views]
        self._pool_device = [transforms.batch_transform(v, self.mean, self.std) for v in views]
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        if self.unlabelled_ratio is None and math.ceil(len(files) / world) < labelled_batches:
            raise UserValueError(f"{self.unlabelled_root}: {len(files)} unlabelled images cannot fill the "
                                 f"{labelled_batches} batches of an epoch; set data.unlabelled_ratio (e.g. 1)")
        pool_batch = None if self.unlabelled_ratio is None else max(1, round(self.unlabelled_ratio * self.batch_size))
        sampler = PoolSampler(len(files), labelled_batches, seed=self.seed, rank=rank, world=world,
                              pool_batch=pool_batch, resume=self._take_resume)
        decoded = ImageFiles([(f, 0) for f in files], views_of(worker), replace_bad=self.skip_bad_images,
                             max_bad_fraction=self.max_bad_fraction)
        images = PoolImages(decoded, len(views), self.seed)
        return DataLoader(images, batch_size=None, sampler=sampler, num_workers=self.num_workers,
                          collate_fn=_unbatched, pin_memory=torch.cuda.is_available(),
                          persistent_workers=self.num_workers > 0)

    def _take_resume(self) -> tuple[int, int] | None:
        resume, self._pool_resume = self._pool_resume, None
        return resume

    def train_dataloader(self) -> Any:
        labelled = super().train_dataloader()
        if self.unlabelled_root is None:
            return labelled
        return CombinedLoader({"labelled": labelled, "unlabelled": self.pool_loader(self._labelled_batches())},
                              mode="max_size_cycle")

    def _labelled_batches(self) -> int:
        """The labelled loader's batches an epoch on one rank (Lightning shards it after this is built)."""
        from vit.data.base import drops_last_batch

        world = getattr(self.trainer, "world_size", None) or 1
        per_rank = math.ceil(len(self.train_set) / world)
        full, rest = divmod(per_rank, self.batch_size)
        return full + (1 if rest and not drops_last_batch(per_rank, self.batch_size) else 0)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A combined batch: the labelled part as usual; each pool view normalised (and erased as its view says)."""
        if not (isinstance(batch, dict) and "unlabelled" in batch):
            return super().on_after_batch_transfer(batch, dataloader_idx)
        *views, position = batch["unlabelled"]
        training = self.trainer is not None and self.trainer.training
        if training:
            self._pool_next = (int(position[0]), int(position[1]) + 1)
        labelled = super().on_after_batch_transfer(batch["labelled"], dataloader_idx)  # (seeds the step's draws)
        views = [step(view, erase=training) for step, view in zip(self._pool_device, views)]
        return {"labelled": labelled, "unlabelled": views}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self._pool_next is not None:  # an epoch's end is saved as the next one's start, under limit_train_batches
            batches = getattr(self.trainer, "num_training_batches", None)
            state["unlabelled_position"] = list(resume_point(self._pool_next, batches) if batches else self._pool_next)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        position = state_dict.get("unlabelled_position")
        self._pool_next = self._pool_resume = tuple(position) if position is not None else None
