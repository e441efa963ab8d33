"""Image transforms: timm's training augmentation and evaluation crop, shared by every image pipeline.

Training images leave the workers as uint8 and are normalised and erased per batch on the device
(`batch_transform`, called by ``ImageDataModule.on_after_batch_transfer``); see `vit.data.fast`.

Names: an ``Augmentation`` holds the settings; ``train_transform`` builds the worker-side transform
(file -> uint8 tensor); ``batch_transform`` builds the device-side batch step (normalise, erase).

The DataModules, `vit predict`, `vit attention` and the exports all build their evaluation
transform here from the same few numbers (size, crop_pct, interpolation, mean, std), which a
checkpoint carries, so a file is prepared for prediction exactly as it was for testing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image

from vit.preprocessing import IMAGENET_MEAN, IMAGENET_STD  # noqa: F401 (here too: the DataModules' import path)


@dataclass(frozen=True)
class Augmentation:
    """The training augmentation settings of the image DataModules (timm's ``create_transform``); see
    `ImageDataModule`."""

    auto_augment: str | None = "rand-m9-mstd0.5-inc1"
    re_prob: float = 0.25
    hflip: float = 0.5
    color_jitter: float = 0.4
    scale: tuple[float, float] = (0.08, 1.0)


def _posterize(img: Image.Image, bits_to_keep: int, **kwargs: Any) -> Image.Image:
    """timm's posterize op, also for 0 bits kept: an all-black image, as Pillow < 13 returned."""
    if bits_to_keep < 1:
        return img.point(lambda _: 0)
    from timm.data.auto_augment import posterize

    return posterize(img, bits_to_keep, **kwargs)


def swap_ops(transform: Callable, replacements: dict[Callable, Callable]) -> Callable:
    """Swap the op functions of timm's AutoAugment/RandAugment/AugMix inside ``transform``, in place.

    Only the function an op calls changes; its probability, magnitude sampling and random draws stay
    timm's. Returns ``transform``.
    """
    for t in getattr(transform, "transforms", [transform]):
        ops = list(getattr(t, "ops", []))  # RandAugment, AugMixAugment
        ops += [op for sub_policy in getattr(t, "policy", []) for op in sub_policy]  # AutoAugment
        for op in ops:
            fn = getattr(op, "aug_fn", None)
            if fn in replacements:
                op.aug_fn = replacements[fn]
    return transform


def guard_posterize(transform: Callable) -> Callable:
    """Let timm's AutoAugment/RandAugment/AugMix posterize keep 0 bits, in place; returns ``transform``.

    timm (1.0.31) maps the top magnitude of "PosterizeIncreasing" (and the bottom of "Posterize") to
    0 bits kept, meaning a black image. Pillow 13.0 made ``ImageOps.posterize`` refuse bits < 1, so a
    few RandAugment draws in a thousand (docs/speed.md, "choices measured") raised ValueError and killed
    training in its first epoch.
    Swapping the op in our own transforms keeps timm's augmentation exactly as it was with
    Pillow <= 12, without pinning Pillow or patching timm for other users in the process.
    """
    from timm.data import auto_augment

    return swap_ops(transform, {auto_augment.posterize: _posterize})


def train_transform(
    augmentation: Augmentation, img_size: int, interpolation: str, mean: Sequence[float], std: Sequence[float],
) -> Callable:
    """timm's training transform up to uint8 (3, S, S): random resized crop, flip, RandAugment or colour jitter.

    Normalisation and random erasing follow on the batch (`batch_transform`), as in timm's prefetcher
    path; `vit.data.fast` says what is faster and why the augmentation stays timm's.
    """
    from timm.data import create_transform

    from vit.data.fast import FastTrainTransform, exact_ops

    # mean only sets the fill colour of timm's geometric ops here; the float steps are batch_transform's
    crop_flip, ops, _ = create_transform(
        input_size=(3, img_size, img_size), is_training=True, scale=augmentation.scale, hflip=augmentation.hflip,
        color_jitter=augmentation.color_jitter or None, auto_augment=augmentation.auto_augment,
        interpolation=interpolation, mean=mean, std=std, use_prefetcher=True, separate=True,
    )
    crop, *flip = crop_flip.transforms  # RandomResizedCropAndInterpolation[, RandomHorizontalFlip]
    ops = guard_posterize(swap_ops(ops, exact_ops()))  # RandAugment / AutoAugment / AugMix / colour jitter
    return FastTrainTransform(crop, flip[0].p if flip else 0.0, ops if ops.transforms else None)


def batch_transform(augmentation: Augmentation, mean: Sequence[float], std: Sequence[float]) -> Callable:
    """The end of the training transform, on a uint8 batch on its device: normalise, random erasing."""
    from vit.data.fast import BatchTransform

    return BatchTransform(mean, std, augmentation.re_prob, re_mode="pixel")


def eval_transform(
    in_chans: int, size: Sequence[int], crop_pct: float, interpolation: str,
    mean: Sequence[float], std: Sequence[float],
) -> Callable:
    """timm's evaluation transform: resize the short side to ``size / crop_pct``, centre crop ``size``,
    normalise. ``size`` is (height, width)."""
    from timm.data import create_transform

    return create_transform(
        input_size=(in_chans, *size), is_training=False, crop_pct=crop_pct,
        interpolation=interpolation, mean=mean, std=std,
    )
