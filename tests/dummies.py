"""Lightning test doubles: modules without the linked attributes, and a callback that crashes a run."""

from __future__ import annotations

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule
from torch.utils.data import DataLoader, TensorDataset


class NoClassesModel(LightningModule):
    """A model whose __init__ has none of the linked names except ``mean``."""

    def __init__(self, width: int = 4, mean: tuple[float, ...] = (0.0,)) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, 1)
        self.mean = mean

    def training_step(self, batch, batch_idx):
        return self.lin(batch[0].flatten(1)[:, :4]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class BareData(LightningDataModule):
    """A datamodule with none of the linked attributes."""

    def train_dataloader(self):
        images = torch.randn(8, 4, 1, 1)  # (B, C, H, W)
        return DataLoader(TensorDataset(images, torch.zeros(8, dtype=torch.long)), batch_size=4)


class CrashAtStep(Callback):
    """Raise after a given number of optimiser steps, to simulate an interrupted run."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            raise RuntimeError(f"simulated crash at step {trainer.global_step}")


class RecordWorldSize(Callback):
    """Append "rank/world size" of each process to ``world_size`` in the working folder, at fit start."""

    def on_fit_start(self, trainer, pl_module) -> None:
        with open("world_size", "a") as f:
            f.write(f"{trainer.global_rank}/{trainer.world_size}\n")


class PoisonBatch(Callback):
    """Make the training batch non-finite at one optimiser step, to test how a run stops on a NaN loss."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            batch[0].fill_(float("nan"))


class RecordBackbone(Callback):
    """Append "rank:epoch:sum of the backbone's weights" to ``backbone`` at fit start (-1) and each epoch end."""

    def _record(self, trainer, pl_module, epoch: int) -> None:
        total = sum(p.detach().double().sum().item() for n, p in pl_module.model.named_parameters()
                    if n.startswith("blocks."))
        with open("backbone", "a") as f:
            f.write(f"{trainer.global_rank}:{epoch}:{total!r}\n")

    def on_fit_start(self, trainer, pl_module) -> None:
        self._record(trainer, pl_module, -1)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._record(trainer, pl_module, trainer.current_epoch)


class RecordSources(Callback):
    """Append each training batch's source sentences to ``sources.<rank>`` in the working folder."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        with open(f"sources.{trainer.global_rank}", "a") as f:
            f.writelines(text + "\n" for text in batch["source_text"])


def quadrant_pixels(n: int, seed: int = 0, unknown: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` uint8 1-channel 8x8 images (n, 1, 8, 8) whose labels are their bright quadrants (4 classes, 1 to 3 of
    them each) and (n, 4) float targets; a share ``unknown`` of the targets is -1 (the image is as its label
    says)."""
    g = torch.Generator().manual_seed(seed)
    targets = torch.zeros(n, 4)
    for i in range(n):
        k = int(torch.randint(1, 4, (), generator=g))
        targets[i, torch.randperm(4, generator=g)[:k]] = 1.0
    pixels = torch.randint(0, 110, (n, 1, 8, 8), generator=g)
    for c, (y, x) in enumerate([(0, 0), (0, 4), (4, 0), (4, 4)]):
        pixels[:, 0, y:y + 4, x:x + 4] += targets[:, c, None, None].long() * 120
    hidden = torch.rand(n, 4, generator=g) < unknown
    return pixels.to(torch.uint8), targets.masked_fill(hidden, -1.0)


def quadrant_images(n: int, seed: int = 0, unknown: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`quadrant_pixels` normalised as the classifier's 1-channel default (mean 0.5, std 0.5) prepares them."""
    pixels, targets = quadrant_pixels(n, seed, unknown)
    return (pixels.float() / 255 - 0.5) / 0.5, targets


class QuadrantLabels(LightningDataModule):
    """A multi-label DataModule in memory (`quadrant_images`): what a labels file's DataModule offers the task."""

    num_classes = 4
    multi_label = True
    in_chans = 1
    img_size = 8
    num_workers = 0

    def __init__(self, n_train: int = 256, n_val: int = 65, n_test: int = 67, batch_size: int = 32,
                 unknown: float = 0.0) -> None:
        super().__init__()
        self.class_names = ["top_left", "top_right", "bottom_left", "bottom_right"]
        self.batch_size = batch_size
        self.sets = {split: TensorDataset(*quadrant_images(n, seed, unknown if split == "train" else 0.0))
                     for split, n, seed in (("train", n_train, 0), ("val", n_val, 1), ("test", n_test, 2))}
        self.test_set = self.sets["test"]

    @property
    def train_set(self) -> TensorDataset:
        """The training split, with ``labels`` (N, C) as a labels file's DataModule has them."""
        self.sets["train"].labels = self.sets["train"].tensors[1]
        return self.sets["train"]

    @property
    def val_set(self) -> TensorDataset:
        return self.sets["val"]

    def eval_split(self, split: str) -> TensorDataset:
        """A split as `vit calibrate` reads it (no augmentation here to take off)."""
        return self.sets[split]

    def train_dataloader(self):
        return DataLoader(self.sets["train"], batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.sets["val"], batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.sets["test"], batch_size=self.batch_size)
