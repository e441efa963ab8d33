"""Images from the DataModule a `vit fit` config builds, prepared the checkpoint's way (for int8 calibration).

Here, not in `vit.deploy.quantize`: building a config's data goes through `vit fit`'s parser, and deployment
never imports the CLI. A folder of images needs none of it (`vit.deploy.quantize.calibration_images`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from vit.data.protocol import ReadableImages
from vit.deploy.quantize import CALIBRATION_IMAGES
from vit.deploy.quantize import calibration_images as folder_images
from vit.errors import UserPathError, UserValueError


def config_split_images(config: str | os.PathLike, split: str, transform: Callable, mode: str,
                        count: int | None = None, seed: int = 0, root: str | None = None) -> tuple[Tensor, Tensor]:
    """(images (N, C, H, W), labels (N,), or (N, C) for multi-label data) of a split of the DataModule a `vit fit`
    config builds (``root``: its data folder), a random ``count`` of them by ``seed`` (``None``: all, in order),
    each decoded as stored and prepared by ``transform``: the checkpoint's eval transform, not the DataModule's.
    Built without the config's pretrained weights, the DataModule normalises as the architecture's default would
    (ImageNet's mean and std), while a checkpoint fine-tuned from an augreg tag was trained on 0.5/0.5
    (`vit.preprocessing`)."""
    config = Path(config)
    if not config.is_file():
        raise UserPathError(f"--calibration {config}: no such config")
    from vit.cli.main import build_model_and_data

    argv = ["--config", str(config), "--model.init_args.pretrained", "null"]
    _, data, _ = build_model_and_data(argv + (["--data.init_args.root", root] if root else []),
                                      "vit export --calibration")
    data.prepare_data()
    data.setup("fit")
    if split == "test":
        data.setup("test")
    dataset = {"train": data.train_set, "val": data.val_set, "test": data.test_set}[split]
    if dataset is None:
        raise UserValueError(f"{config}: its {type(data).__name__} has no {split} split")
    if not isinstance(dataset, ReadableImages):
        raise UserValueError(f"--calibration {config}: its {type(dataset).__name__} gives no decoded images to "
                             "prepare the checkpoint's way; pass a folder of training images instead")
    indices = list(range(len(dataset))) if count is None else \
        torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:count].tolist()
    images = torch.stack([transform(dataset.raw_image(i).convert(mode)) for i in indices])
    labels = dataset.labels  # a list of classes, or multi-label data's (N, C) tensor of 1/0/-1
    return images, labels[indices] if isinstance(labels, Tensor) else torch.tensor([int(labels[i]) for i in indices])


def calibration_images(source: str | os.PathLike, transform: Callable, mode: str,
                       count: int = CALIBRATION_IMAGES, seed: int = 0) -> Tensor:
    """Up to ``count`` images (N, C, H, W) for int8 calibration, prepared by ``transform`` (the eval transform), from
    a `vit fit` config (``.yaml``: its DataModule's training split) or a folder (`vit.deploy.quantize`'s)."""
    if Path(source).suffix.lower() in (".yaml", ".yml"):
        return config_split_images(source, "train", transform, mode, count, seed)[0]
    return folder_images(source, transform, mode, count, seed)
