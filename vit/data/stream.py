"""Images streamed from `vit shard`'s shards (a folder or an s3:// / gs:// URL), with exact mid-epoch resume.

```
shards ─► LitData StreamingDataset (chunks cached locally) ─► decode as ImageFolder does ─► train_transform (uint8)
      ─► StreamingDataLoader (stateful: its position goes into the checkpoint) ─► batch_transform on the device
```
What makes a resumed run end with the same weights, bit for bit on a CPU, as an uninterrupted one:
- the loader's position is saved in every checkpoint and a resumed run carries on from the next
  batch. The DataModule saves and restores it itself: Lightning saves a stateful loader too, but
  restores it only when it builds the loader after the restore, and ``estimated_stepping_batches``
  (which the lr schedule reads) builds it before, so the run would silently restart the epoch;
- every random draw of the worker-side transform is seeded from (seed, epoch, sample index), so a
  sample gets the same crop and RandAugment ops whichever run, worker or rank draws it;
- before each training batch's device step, the global RNGs (erasing, mixup, drop path, dropout)
  are seeded from (seed, rank, training batches so far); that count is saved with the checkpoint.

Under DDP (any number of nodes) LitData deals the shuffled samples out to the ranks: every sample is
read by exactly one rank per epoch. To give every rank the same number of batches it drops the
remainder: of N samples, each rank trains on floor(N / world) of them rounded down to whole batches,
and the few left over (fewer than world x batch_size) sit out this epoch; the next epoch's shuffle
(from the seed and the epoch) leaves out others.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from litdata import StreamingDataLoader, StreamingDataset
from torch import Tensor

from vit.data.base import ImageDataModule
from vit.data.fast import FastTrainTransform, collate
from vit.data.seeds import mixed_seed, seed_all, seed_transform
from vit.data.shards import decode_sample, is_url, opened, read_info, split_dir
from vit.errors import UserValueError


class ShardSet(StreamingDataset):
    """One split of the shards as (image, label): decoded as `ImageFolder` decodes files, then transformed.

    With ``seeded``, the transform's draws are a function of (seed, epoch, sample index) alone. The
    transform is ``image_transform``: LitData's StreamingDataset reserves ``transform`` for its own hook.
    """

    def __init__(self, input_dir: Any, image_transform: Callable | None, *, train: bool = False, seed: int = 0,
                 max_cache_size: str | None = None) -> None:
        super().__init__(input_dir, shuffle=train, drop_last=train, seed=seed, max_cache_size=max_cache_size)
        self.image_transform, self.seeded = image_transform, train
        self.init_args = {"input_dir": input_dir, "seed": seed, "max_cache_size": max_cache_size}

    def __getitem__(self, index: Any) -> tuple[Any, int]:
        item = super().__getitem__(index)
        if self.image_transform is None:
            return decode_sample(item["image"], item["id"]), int(item["label"])
        if self.seeded:
            position = int(getattr(index, "index", index))  # litdata's ChunkedIndex, or an int
            seed_transform(mixed_seed(self.seed, self.current_epoch, position))
        if isinstance(self.image_transform, FastTrainTransform):  # it decodes: a big JPEG at a fraction of its size
            with opened(item["image"], item["id"]) as img:
                return self.image_transform(img), int(item["label"])
        return self.image_transform(decode_sample(item["image"], item["id"])), int(item["label"])

    def item_name(self, index: int) -> str:
        """The sample's path in the image folder it was sharded from."""
        return str(super().__getitem__(index)["id"])


class ResumableLoader(StreamingDataLoader):
    """LitData's StreamingDataLoader, replaying a loaded position for one iteration only.

    LitData (0.2.76) replays a loaded position while ``restore`` is set, and clears it only when an
    iteration runs to its end (StopIteration). Lightning (2.6) never asks for that end: its fetcher
    stops once it has fetched ``len(loader)`` batches. So after a mid-epoch resume the flag survived
    the resumed epoch, the next epoch replayed the saved position again (in `vit fit`, an empty
    epoch), and every epoch after it was one LitData epoch (shuffle and augmentation seeds) behind:
    a run resumed before its last epoch lost an epoch without a word. Here the next ``iter()`` clears
    the flag.
    """

    _replay = False  # the next iteration replays the position load_state_dict restored

    def __iter__(self) -> Any:
        if not self._replay:
            self.restore = False  # a resumed iteration is over, run to its end or not: start a new epoch
        self._replay = False
        return super().__iter__()

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        super().load_state_dict(obj)
        self._replay = self.restore  # False for a position after the epoch's last batch: a new epoch follows


class ImageShards(ImageDataModule):
    """Images from `vit shard`'s shards, streamed: ``root`` is the shard folder or its s3:// or gs:// URL.

    The same transforms as `ImageFolder` (uint8 work in the loader workers, normalise and erase per
    batch on the device); class names, image settings and per-class counts come from the shards'
    info.json, so checkpoints carry what `vit predict`, `vit export` and `vit attention` need. A
    training run interrupted mid-epoch and resumed from ``last.ckpt`` carries on at the next batch
    and ends with the same weights (see the module docstring, and what DDP does with the remainder).

    Args:
        root: the shard folder written by `vit shard`, or its URL (s3://bucket/path, gs://bucket/path).
        cache_dir: where chunks of a URL are cached (default ~/.cache/vit/shards/<bucket>/<path>); unused
            for a local folder, which is read in place.
        max_cache_size: cap of that cache, e.g. "200GB" (default: LitData's, 75% of the free disk).
        batch_size: images per batch (per device).
    """

    def __init__(
        self,
        root: str,
        cache_dir: str | None = None,
        max_cache_size: str | None = None,
        *,
        batch_size: int = 64,
        **kwargs: Any,
    ) -> None:
        super().__init__(batch_size=batch_size, **kwargs)
        self.root = root if is_url(root) else str(Path(root).expanduser())
        self.cache_dir, self.max_cache_size = cache_dir, max_cache_size
        self._info: dict[str, Any] | None = None
        self.batches_seen = 0  # training batches so far, over all epochs: the key of each batch's draws
        self._train_loader: StreamingDataLoader | None = None
        self._loader_state: dict[str, Any] | None = None  # from a checkpoint, for the next training loader

    @property
    def info(self) -> dict[str, Any]:
        """The shards' info.json (class names, split sizes and counts), read on first use."""
        if self._info is None:
            self._info = read_info(self.root, self.cache_dir)
        return self._info

    @property
    def class_names(self) -> list[str]:
        """The class names the shards were written with."""
        return list(self.info["class_names"]) if self._class_names is None else self._class_names

    @class_names.setter
    def class_names(self, names: list[str]) -> None:
        self._class_names = list(names) or None

    def _split(self, name: str, transform: Callable | None, train: bool = False) -> ShardSet:
        """One split; training shuffles (from the seed and the epoch), seeds its draws and drops the remainder."""
        return ShardSet(split_dir(self.root, name, self.cache_dir), transform, train=train, seed=self.seed,
                        max_cache_size=self.max_cache_size)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        splits = self.info["splits"]
        eval_tf = self.eval_transform()
        self.train_set = self._split("train", self.train_transform(), train=True)
        self.val_set = self._split("val", eval_tf)
        self.test_set = self._split("test", eval_tf) if "test" in splits else self.val_set
        test = f"{splits['test']} test" if "test" in splits else "no test (val stands in for it)"
        rank_zero_info(f"{self.root}: {splits['train']} train, {splits['val']} val, {test} images, "
                       f"{self.num_classes} classes (shards)")

    def class_counts(self, split: str = "train") -> list[int]:
        """Images per class in a split, from info.json (no shard is read)."""
        return list(self.info["class_counts"][split])

    def without_augmentation(self, dataset: ShardSet) -> ShardSet:
        """A copy of a split that uses the evaluation transform, unseeded and in stored order."""
        return ShardSet(**dataset.init_args, image_transform=self.eval_transform())

    def _loader(self, dataset: Any, name: str, train: bool = False) -> StreamingDataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__} has no {name} split; was setup() called?")
        return ResumableLoader(dataset, batch_size=self.batch_size, num_workers=self.num_workers,
                                   collate_fn=collate, pin_memory=torch.cuda.is_available())

    def train_dataloader(self) -> StreamingDataLoader:
        """The training loader, at the position a checkpoint saved when resuming."""
        self._train_loader = self._loader(self.train_set, "train", train=True)
        if len(self._train_loader) == 0:  # every rank drops its remainder: a small split can leave nothing at all
            world = self.trainer.world_size if self.trainer is not None else 1
            raise UserValueError(
                f"{self.root}: {self.info['splits']['train']} training images make no whole batch of "
                f"{self.batch_size} on each of {world} rank(s); set --data.init_args.batch_size to at most "
                f"{max(1, self.info['splits']['train'] // world)}")
        if self._loader_state is not None:
            self._train_loader.load_state_dict(self._loader_state)
            self._loader_state = None
        return self._train_loader

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Seed the global RNGs from (seed, rank, training batches so far), then the device step (normalise, erase).

        Random erasing here, and mixup, drop path and dropout in the model, then draw the same numbers
        in a resumed run as in an uninterrupted one."""
        images = batch[0] if isinstance(batch, (tuple, list)) and batch else None
        if self.trainer is not None and self.trainer.training and isinstance(images, Tensor):
            seed_all(mixed_seed(self.seed, self.trainer.global_rank, self.batches_seen))
            self.batches_seen += 1
        return super().on_after_batch_transfer(batch, dataloader_idx)

    def state_dict(self) -> dict[str, Any]:
        """Saved in checkpoints: the training batches so far and the training loader's position."""
        state: dict[str, Any] = {"batches_seen": self.batches_seen}
        if self._train_loader is not None:
            state["train_loader"] = self._train_loader.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restored before the loaders are built (Lightning restores DataModules first)."""
        self.batches_seen = int(state_dict.get("batches_seen", 0))
        self._loader_state = state_dict.get("train_loader")
