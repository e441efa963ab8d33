"""Tiny Lightning modules without the classification attributes, for the CLI link tests."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class NoClassesModel(L.LightningModule):
    """A model whose __init__ has none of the linked names except ``mean``."""

    def __init__(self, width: int = 4, mean: tuple[float, ...] = (0.0,)) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, 1)
        self.mean = mean

    def training_step(self, batch, batch_idx):
        return self.lin(batch[0].flatten(1)[:, :4]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class BareData(L.LightningDataModule):
    """A datamodule with none of the linked attributes."""

    def train_dataloader(self):
        images = torch.randn(8, 4, 1, 1)  # (B, C, H, W)
        return DataLoader(TensorDataset(images, torch.zeros(8, dtype=torch.long)), batch_size=4)
