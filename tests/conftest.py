"""Test-wide settings: headless plotting, no network, deterministic seeds."""

import os

# Set before anything imports matplotlib, wandb or huggingface_hub.
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # fail fast instead of retrying for a minute offline
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
