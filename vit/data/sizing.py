"""The input side a from-scratch recipe trains at, read from the images themselves (``img_size: auto``).

The small-folder recipes (configs/scratch_small.yaml, configs/multilabel_cpu.yaml) were tuned at 32x32 in 8x8
patches: right for digits and scans of 8-28 px, but it throws away detail of larger images. A plain timm loop at the
images' own side beat it on 56x56 photo composites (issue 64: 0.849 against 0.820 macro mAP) and on 48-px texture
tiles (seed 0: 0.792 against 0.786; the recipe at 48 scored 0.810; scripts/experiments/parity_suite.py,
docs/small-folders.md). ``auto`` is the images' typical side:

    median short side of up to SAMPLE training images, rounded to the nearest multiple of PATCH (halves up),
    within [LOW, HIGH]

so images of 32 px or less keep the tuned 32, a 56-px composite trains at 56 (7x7 patches of 8) and anything of
HIGH or more at HIGH (8x8 patches: at most 4x the tokens, and the time, of 32).

``auto_augment: auto`` (configs/finetune/folder_cpu.yaml) is the augmentation's strength for the same typical side:

    images drawn at UPSAMPLED x their own side or more (small images: digits, icons, scans) get SMALL (no
    RandAugment, no random erasing, crops of 70-100% of the image; timm's colour jitter, at the config's
    strength, then applies); the rest get POLICY with the config's re_prob and scale

RandAugment at magnitude 9 and crops down to 8% of the image make new views of a photo, but of a 40-px digit drawn at
96 they leave fragments and smears. Measured on scikit-learn's digits at 40 px fine-tuned at 96 from a random
ViT-Ti file (scripts/experiments/parity_suite.py, seed 0): 0.162 with the policy, 0.332 with SMALL (3 seeds: 0.320,
still 29 points under the plain loop's 0.611); 64-px textures (drawn at 1.5x) keep the policy, under which the
recipe scored 0.933 against the plain loop's 0.862 (3 seeds; docs/small-folders.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

LOW, HIGH, PATCH, SAMPLE = 32, 64, 8, 64
UPSAMPLED, POLICY = 2.0, "rand-m9-mstd0.5-inc1"
SMALL: dict[str, Any] = {"auto_augment": None, "re_prob": 0.0, "scale": (0.7, 1.0)}


def auto_img_size(sides: Sequence[int]) -> int:
    """The side to train at for images of these (short) sides: see the module docstring."""
    if not sides:
        return LOW
    typical = statistics.median(sides)
    return int(min(HIGH, max(LOW, PATCH * math.floor(typical / PATCH + 0.5))))  # halves round up


def auto_augmentation(sides: Sequence[int], img_size: int) -> dict[str, Any]:
    """The augmentation settings ``auto_augment: auto`` stands for, for images of these (short) sides drawn at
    ``img_size``: SMALL when the median side is 1/UPSAMPLED of ``img_size`` or less, else POLICY alone (the
    config's re_prob and scale stand)."""
    if sides and img_size >= UPSAMPLED * statistics.median(sides):
        return dict(SMALL)
    return {"auto_augment": POLICY}


def short_sides(paths: Iterable[Any], limit: int = SAMPLE) -> list[int]:
    """The short side of the first ``limit`` readable images among ``paths`` (files, or anything PIL opens: a
    Hugging Face row's bytes); headers only, no decoding."""
    from PIL import Image

    sides = []
    for path in paths:
        try:
            with Image.open(path) as image:
                sides.append(min(image.size))
        except OSError:  # an unreadable file is the bad-image checks' business, not this guess's
            continue
        if len(sides) >= limit:
            break
    return sides
