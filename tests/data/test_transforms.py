"""Training augmentation never crashes: every timm op at its extreme magnitudes, and a soak per recipe."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from timm.data import create_transform

from tests import CONFIGS
from tests.formats import write_cifar10, write_cifar100, write_class_folders
from vit.data.transforms import guard_posterize

POLICIES = ["rand-m9-mstd0.5-inc1", "rand-m9-mstd0.5", "original", "v0", "augmix-m5-w4-d2"]


def augment_ops(policy: str) -> list:
    """The timm AugmentOps inside the guarded training transform of ``policy``."""
    transform = guard_posterize(create_transform(32, is_training=True, auto_augment=policy))
    ops = []
    for t in transform.transforms:
        ops += list(getattr(t, "ops", []))
        ops += [op for sub_policy in getattr(t, "policy", []) for op in sub_policy]
    assert ops, f"no augmentation ops found for {policy}"
    return ops


@pytest.mark.parametrize("policy", POLICIES)
def test_every_augment_op_survives_its_extreme_magnitudes(policy):
    """Each op at magnitude 0 and 10, on colour and grayscale-sourced RGB images (our loaders hand timm
    RGB only): a new Pillow or timm that rejects an argument at the edge of its range fails here, not
    hours into a run."""
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8))
    images = [rgb, rgb.convert("L").convert("RGB"), rgb.convert("RGBA").convert("RGB")]
    for op in augment_ops(policy):
        op.prob, op.magnitude_std = 1.0, 0.0
        for magnitude in (0, 10):
            op.magnitude = magnitude
            for image in images:
                out = op(image)
                assert out.size == image.size and out.mode == image.mode, op.name


def test_posterize_keeping_zero_bits_is_a_black_image_as_timm_means():
    """timm's PosterizeIncreasing at the top magnitude keeps 0 bits (Pillow >= 13 refuses 0 bits)."""
    op = next(op for op in augment_ops("rand-m9-mstd0.5-inc1") if op.name == "PosterizeIncreasing")
    op.prob, op.magnitude_std, op.magnitude = 1.0, 0.0, 10
    image = Image.fromarray(np.full((8, 8, 3), 200, np.uint8))
    assert np.asarray(op(image)).max() == 0
    op.magnitude = 5  # 2 bits kept: 200 = 0b11001000 -> 0b11000000
    assert (np.asarray(op(image)) == 192).all()


IMAGE_MODULES = ("CIFAR", "ImageFolder", "ImageNet", "ImageShards", "UnlabelledFolder")


def image_recipes() -> list[Path]:
    """Every config whose DataModule trains on images through a worker-side transform (shards and MAE's
    unlabelled folders included: their augmentation is built from their own YAML as the others' is)."""
    found = []
    for path in sorted(CONFIGS.rglob("*.yaml")):
        data = (yaml.safe_load(path.read_text()) or {}).get("data") or {}
        if str(data.get("class_path", "")).rsplit(".", 1)[-1] in IMAGE_MODULES:
            found.append(path)
    return found


def build_datamodule(config: Path, root: Path):
    """The recipe's DataModule, parsed from its own YAML as `vit fit` parses it, on a synthetic root."""
    from jsonargparse import ArgumentParser
    from lightning.pytorch import LightningDataModule

    data = yaml.safe_load(config.read_text())["data"]
    data = {"class_path": data["class_path"], "init_args": dict(data.get("init_args") or {})}
    is_cifar = data["class_path"].endswith("CIFAR")
    if is_cifar:
        variant = data["init_args"].get("variant", 10)
        (write_cifar10 if variant == 10 else write_cifar100)(root)
        data["init_args"].update(download=False, val_size=20 if variant == 10 else 100)
    else:
        for split in ("train", "val"):
            # 48x48 sources in RGB, grayscale and RGBA: each becomes RGB before the transform
            write_class_folders(root / split, ["a", "b"], per_class=6, modes=("RGB", "L", "RGBA"), size=48)
    data["init_args"].update(root=str(root), num_workers=0)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningDataModule, "data")
    return parser.instantiate_classes(parser.parse_object({"data": data})).data


def test_every_image_recipe_is_soaked():
    names = {p.stem for p in image_recipes()}
    assert {"cifar10_vit", "cifar100_vit", "imagenet_vit_small", "imagenet_vit_base"} <= names
    assert {"shards_cpu", "imagenet_vit_base_stream", "mae_folder_vit_small", "mae_imagenet_vit_base"} <= names
    assert {"scratch_small", "teacher_small", "distill_small"} <= names


@pytest.fixture(scope="session")
def pipelines(tmp_path_factory) -> dict[Path, str]:
    """Each image recipe's training transform, described (its repr, every op and setting): 24 recipes share 8."""
    return {config: repr(build_datamodule(config, tmp_path_factory.mktemp(config.stem)).train_transform())
            for config in image_recipes()}


@pytest.mark.slow
@pytest.mark.parametrize("config", image_recipes(), ids=lambda p: p.stem)
def test_recipe_training_transform_survives_1000_random_images(config, tmp_path, pipelines):
    """Every recipe's own augmentation over random RGB, grey and RGBA images: 1,000 (each RandAugment op drawn
    hundreds of times) for the first recipe of each distinct pipeline, 30 for a recipe whose pipeline another has
    soaked. The 3,000-image soak of each recipe is `../shared/checks/B-augment-soak`, run apart."""
    dm = build_datamodule(config, tmp_path)
    transform = dm.train_transform()
    soaked_by = min(c for c, described in pipelines.items() if described == repr(transform))
    rng = np.random.default_rng(0)
    for i in range(1000 if soaked_by == config else 30):
        pixels = rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)
        image = Image.fromarray(pixels)
        if i % 3 == 1:
            image = image.convert("L").convert("RGB")
        elif i % 3 == 2:
            image = image.convert("RGBA").convert("RGB")
        out = transform(image)
        assert out.shape == (3, dm.img_size, dm.img_size)


@pytest.mark.parametrize(("size", "crop_pct", "resized"), [(224, 0.875, 256), (224, 1.0, 224), (32, 0.9, 35)])
def test_eval_transform_resizes_the_short_side_then_centre_crops(size, crop_pct, resized):
    """timm's recipe: the short side becomes floor(size / crop_pct), then the centre size x size is kept."""
    from torchvision.transforms import CenterCrop, Resize

    from vit.data.transforms import eval_transform

    transform = eval_transform(3, (size, size), crop_pct, "bicubic", (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    steps = transform.transforms
    resize = next(t for t in steps if isinstance(t, Resize))
    crop = next(t for t in steps if isinstance(t, CenterCrop))
    assert resize.size in (resized, [resized]) and tuple(crop.size) == (size, size)
    # a wide image: its height becomes `resized`, then the centre is cropped
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (300, 500, 3), dtype=np.uint8))
    out = transform(image)
    assert out.shape == (3, size, size)
    width = int(resized * 500 / 300)  # the long side follows the aspect ratio, rounded down
    reference = np.asarray(image.resize((width, resized), Image.Resampling.BICUBIC))
    top, left = round((resized - size) / 2), round((width - size) / 2)
    expected = torch.tensor(reference[top:top + size, left:left + size]).permute(2, 0, 1) / 255
    torch.testing.assert_close(out, expected)
