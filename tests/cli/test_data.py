"""The images a config's data gives (`vit.cli.data`): calibration through the checkpoint's transform, not the
DataModule's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tests.deploy.conftest import CONFIG


def test_calibration_from_a_config_goes_through_the_checkpoints_transform_not_the_datamodules():
    """A config's DataModule, built without its pretrained weights, normalises as the architecture's default would
    (ImageNet's mean and std for a fine-tuning recipe whose checkpoint was trained on augreg's 0.5): the images
    must be decoded as stored and prepared by the transform given, the checkpoint's, as `vit predict` does."""
    from vit.cli.data import calibration_images, config_split_images  # (deploy's own takes a folder alone)

    def brightness(image):  # a transform of our own: (1, 1, 1), the image's mean pixel value
        return torch.tensor(np.asarray(image), dtype=torch.float32).mean().reshape(1, 1, 1)

    drawn = calibration_images(CONFIG, brightness, "L", count=8)
    every, labels = config_split_images(CONFIG, "train", brightness, "L")  # all, in order
    assert drawn.shape == (8, 1, 1, 1) and len(every) == len(labels) > 1000 and set(labels.tolist()) == set(range(10))
    assert all((every == value).any() for value in drawn)  # (the test split: benchmark_inference.py's test)


def test_multi_label_data_gives_its_label_rows(tmp_path):
    """`vit export --int8 static --calibration` with a multi-label config: the labels are the (N, C) rows of 1/0,
    where int() of a row raised."""
    from tests import load_script
    from vit.cli.data import config_split_images

    root = load_script("multilabel_digits").write_composites(tmp_path / "data", {"train": 30, "val": 10, "test": 10})
    config = Path(__file__).parents[2] / "configs" / "multilabel_cpu.yaml"
    images, labels = config_split_images(config, "train", lambda image: torch.zeros(1, 2, 2), "L", count=6,
                                         root=str(root))
    assert images.shape == (6, 1, 2, 2) and labels.shape == (6, 10)
    assert all(1 <= sum(r) <= 3 and set(r) <= {0.0, 1.0} for r in labels.tolist())  # 1 to 3 digits a composite
