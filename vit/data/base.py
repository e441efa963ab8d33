"""What every image DataModule shares: the options linked into the model, and the loaders.

Every DataModule knows ``num_classes``, ``class_names``, ``img_size``, ``in_chans``, ``mean``, ``std``,
``crop_pct`` and ``interpolation`` right after ``__init__``, so the CLI can link them into the model
(and from there into the checkpoint). Batches are ``(images (B, C, H, W) float, labels (B,) int64)``
by the time the model sees them: training images leave the workers as uint8, and
``on_after_batch_transfer`` normalises (and, in training, randomly erases) them on the device.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from vit.data import sizing, transforms
from vit.data.fast import collate
from vit.data.protocol import EvaluationSplits, ImageFileSamples, IndexedSubset, LabelledImages
from vit.data.resume import EpochOrder, SeededSamples, TrainingPosition
from vit.data.seeds import seed_all
from vit.data.transforms import Augmentation
from vit.errors import UserValueError
from vit.preprocessing import Preprocessing, default_normalisation


class ImageDataModule(LightningDataModule):
    """Shared options and loaders; subclasses fill ``class_names`` and build the three splits in ``setup``.

    Subclasses take their own arguments, restate only the shared ones whose default differs, and
    pass the rest on as ``**kwargs``; `vit fit --help` still shows every argument with its default.
    Training transforms are timm's ``create_transform`` (random resized crop, flip, RandAugment or
    colour jitter, random erasing); evaluation is resize + centre crop (``crop_pct``) + normalise.
    One name each: ``augmentation`` holds the settings, ``train_transform()`` is the worker-side
    transform (file -> uint8 image) and ``batch_transform`` the device-side batch step (normalise,
    erase), run by ``on_after_batch_transfer`` (`vit.data.fast`), so loader workers do the least work and pass
    uint8 (docs/speed.md has the figures).

    Args:
        batch_size: images per batch (per device).
        num_workers: DataLoader worker processes.
        img_size: side of the square images the model sees (224); "auto" (folders and labels files): the
            images' own typical side within 32-64 (`vit.data.sizing`), for the small from-scratch recipes.
        mean: normalisation mean per channel (ImageNet's).
        std: normalisation standard deviation per channel (ImageNet's).
            (These two, ``img_size``, ``crop_pct`` and ``interpolation``: None is "the pretrained weights' own":
            under `vit fit`, the values of ``model.init_args.pretrained``'s timm tag or file (`vit.preprocessing`),
            said in the run's first lines; else the default named here.)
        auto_augment: timm policy, e.g. "rand-m9-mstd0.5-inc1" (RandAugment) or "autoaug"; None = off; "auto"
            (folders and labels files): RandAugment m9, but for images drawn at 2x their side or more none, no
            erasing and crops of 70-100% (`vit.data.sizing.auto_augmentation`).
        re_prob: random-erasing probability.
        hflip: horizontal flip probability.
        color_jitter: colour-jitter strength, 0 = off (timm skips it when auto_augment is set).
        scale: range of the random resized crop's area fraction.
        crop_pct: evaluation centre crop: resize to img_size / crop_pct, then crop img_size (0.875).
        interpolation: resize interpolation ("bicubic", "bilinear", ...; bicubic).
        seed: seed of any split this DataModule carves.
    """

    in_chans = 3
    # whether "auto" (img_size, auto_augment) is read from the files (ImageFolder and LabelsFile)
    sizes_from_images = False

    def __init__(
        self,
        *,
        batch_size: int = 128,
        num_workers: int = 4,
        img_size: int | Literal["auto"] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        re_prob: float = 0.25,
        hflip: float = 0.5,
        color_jitter: float = 0.4,
        scale: tuple[float, float] = (0.08, 1.0),
        crop_pct: float | None = None,
        interpolation: str | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        img_size = 224 if img_size is None else img_size
        for key, value, instead in (("img_size", img_size, "a number of pixels"),
                                    ("auto_augment", auto_augment, "a timm policy or null")):
            if value == "auto" and not self.sizes_from_images:
                raise UserValueError(f"{key}: auto reads the images' sides, which {type(self).__name__} does not: "
                                     f"give {instead}")
        mean, std = default_normalisation(self.in_chans, mean, std)  # one owner of the defaults
        crop_pct = 0.875 if crop_pct is None else crop_pct
        interpolation = interpolation or "bicubic"
        if batch_size < 1:
            raise UserValueError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.img_size = img_size
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.augmentation = Augmentation(auto_augment, re_prob, hflip, color_jitter, tuple(scale))  # and batch's
        self.crop_pct = crop_pct
        self.interpolation = interpolation
        self.seed = seed
        self.class_names: list[str] = []
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.training_position = TrainingPosition()  # the shuffled training loader's, for a mid-epoch resume
        self._resumable = False  # whether the training loader is `vit.data.resume`'s (not a custom sampler's)

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.class_names)

    @property
    def preprocessing(self) -> Preprocessing:
        """How this data prepares an image for the model (normalisation, crop, interpolation): the record the CLI
        links into the classifier, whose checkpoint keeps it for prediction."""
        return Preprocessing(self.mean, self.std, self.crop_pct, self.interpolation)

    @property
    def augmentation(self) -> Augmentation:
        """The training augmentation; ``auto_augment: auto`` is resolved from the training images on first use
        (`vit.data.sizing.auto_augmentation`)."""
        if self._augmentation.auto_augment == "auto":
            chosen = sizing.auto_augmentation(self.image_sides(), self.img_size)
            self.augmentation = dataclasses.replace(self._augmentation, **chosen)
            rank_zero_info(f"auto_augment auto: {chosen} (for images of their typical side drawn at {self.img_size})")
        return self._augmentation

    @augmentation.setter
    def augmentation(self, value: Augmentation) -> None:
        self._augmentation = value
        self.batch_transform = transforms.batch_transform(value, self.mean, self.std)  # the device's share

    def image_sides(self) -> list[int]:
        """The short sides of a sample of the training images (the DataModules that read files: ``auto``)."""
        return []

    @property
    def auto_augment(self) -> str | None:
        """The timm augmentation policy of the training transform."""
        return self.augmentation.auto_augment

    def train_transform(self) -> Callable:
        """The worker-side training transform: timm's, with this DataModule's augmentation, up to uint8 (C, H, W)."""
        return transforms.train_transform(self.augmentation, self.img_size, self.interpolation, self.mean, self.std)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Finish uint8 training batches on the device: normalise, and randomly erase while training."""
        training = self.trainer is not None and self.trainer.training
        if training and self._resumable:  # the same draws after a restart (`vit.data.resume`)
            epoch, rank = getattr(self.trainer, "current_epoch", 0), getattr(self.trainer, "global_rank", 0)
            seed_all(self.training_position.step(epoch, rank))
        images = batch[0] if isinstance(batch, (tuple, list)) and batch else None
        if not (isinstance(images, Tensor) and images.dtype == torch.uint8):
            return batch  # evaluation batches are float already
        return [self.batch_transform(images, erase=training), *batch[1:]]

    def state_dict(self) -> dict[str, Any]:
        """In the checkpoint: the shuffled training loader's position (`vit.data.resume`)."""
        if not self._resumable:
            return {}
        return {"training_position": self.training_position.state_dict(getattr(self.trainer, "num_training_batches",
                                                                               None))}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restored before Lightning builds the loaders: the next training loader starts where the run stopped."""
        if "training_position" in state_dict:
            self.training_position.load_state_dict(state_dict["training_position"])

    def eval_transform(self) -> Callable:
        """timm's evaluation transform: resize, centre crop (crop_pct), normalise."""
        return transforms.eval_transform(
            self.in_chans, (self.img_size, self.img_size), self.crop_pct, self.interpolation, self.mean, self.std
        )

    def class_counts(self, split: str = "train") -> list[int]:
        """Images per class in a split (after ``setup``), in ``class_names`` order."""
        dataset = getattr(self, f"{split}_set", None)
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__} has no {split} split; was setup() called?")
        counts = torch.bincount(torch.as_tensor(dataset.labels), minlength=self.num_classes)
        return counts.tolist()

    def eval_split(self, split: str) -> Dataset:
        """The "train", "val" or "test" split as evaluation sees it: the training split without augmentation."""
        dataset = {"train": self.train_set, "val": self.val_set, "test": self.test_set}[split]
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__} has no {split} split; was setup() called?")
        return self.without_augmentation(dataset) if split == "train" else dataset

    def without_augmentation(self, dataset: Dataset) -> Dataset:
        """A shallow copy of ``dataset`` (one with a ``transform``) that uses the evaluation transform."""
        if not isinstance(dataset, LabelledImages):
            raise TypeError(f"{type(self).__name__}: a {type(dataset).__name__} has no `transform` to swap for "
                            "the evaluation one; override without_augmentation")
        plain = copy.copy(dataset)
        plain.transform = self.eval_transform()
        return plain

    def train_sampler(self) -> Sampler | None:
        """A sampler for the training split, or None to shuffle (subclasses may weight classes)."""
        return None

    def _loader(self, dataset: Dataset | None, name: str, train: bool = False) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__} has no {name} split; was setup() called?")
        sampler = self.train_sampler() if train else None
        ranks = getattr(self.trainer, "world_size", None) or 1  # (a trainer stand-in may lack it)
        drop = train and drops_last_batch(math.ceil(len(dataset) / ranks), self.batch_size)
        if train and sampler is None:  # shuffled: resumable mid-epoch, bit for bit (`vit.data.resume`)
            seed, rank = self.training_position.loader_seed(), getattr(self.trainer, "global_rank", 0)
            sampler = EpochOrder(len(dataset), self.batch_size, seed=seed, rank=rank, world=ranks,
                                 resume=self.training_position.take)
            dataset, self._resumable = SeededSamples(dataset, seed), True
        return DataLoader(
            dataset, batch_size=self.batch_size, sampler=sampler,
            num_workers=self.num_workers, drop_last=drop, collate_fn=collate,
            pin_memory=torch.cuda.is_available(), persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, "train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, "val")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, "test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, "test")


def drops_last_batch(num_samples: int, batch_size: int) -> bool:
    """Whether a training loader over ``num_samples`` (one rank's) drops its last, partial batch: only when
    it is under half a batch. A tiny last batch is a noisy step at the full lr; dropping a large one leaves
    a big share of a small folder out of every epoch (36 of 100 images at batch 64)."""
    remainder = num_samples % batch_size
    return num_samples > batch_size and 0 < remainder < batch_size / 2


# ---- is the test split held out? -------------------------------------------------------------------
def _members(dataset: Dataset) -> set | None:
    """What identifies a split's images (file paths, or indices into one dataset), or None if unknown."""
    if isinstance(dataset, ImageFileSamples):
        return {str(path) for path, _ in dataset.samples}
    if isinstance(dataset, IndexedSubset):  # CIFAR's subsets
        return {(id(dataset.dataset), int(i)) for i in dataset.indices}
    return None


def no_test_reason(data: Any) -> str | None:
    """Why a set-up datamodule's test split is no held-out test (it is missing, is the val split or shares
    images with it), or None when it is one."""
    if not isinstance(data, EvaluationSplits):  # a datamodule of another kind (translation): its splits are its own
        return None
    val, test = data.val_set, data.test_set
    if test is None:
        return "the data has no test split"
    if test is val:
        return "the test split is the val split"
    val_ids, test_ids = _members(val), _members(test)
    if val_ids is None or test_ids is None:  # a dataset of unknown kind: its splits are trusted apart
        return None
    shared = len(val_ids & test_ids)
    if shared and shared == len(test_ids):
        return "the test split is the val split"
    if shared:
        return f"the test split shares {shared} of its {len(test_ids)} images with val"
    return None
