"""Seeds from a few integers, and the RNGs a worker-side transform draws from: what makes a streamed sample's
crop and augmentation a function of (seed, epoch, index) alone, whichever run, worker or rank draws it
(`vit.data.stream`'s shards and `vit.data.hfstream`'s Arrow rows)."""

from __future__ import annotations

import random

import numpy as np
import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One step of splitmix64 (Steele, Lea and Flood): a 64-bit integer -> a well-mixed 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mixed_seed(*values: int) -> int:
    """A 63-bit seed from a few integers, well spread: splitmix64 chained over them, in pure Python.

    About 1 us; numpy's SeedSequence, used before, took 7 us alone and ~45 us per sample in a loader."""
    h = 0
    for v in values:
        h = _splitmix64(h ^ (int(v) & _MASK64))
    return h >> 1


def seed_transform(seed: int) -> None:
    """Seed the CPU RNGs a worker-side transform draws from: python's ``random`` (timm's crop box, op
    probabilities and magnitudes), numpy's global RNG (RandAugment's op choice, AugMix) and torch's
    CPU generator (the flip, torchvision's colour jitter). Cheap enough to run per sample.

    Not ``torch.manual_seed``: it also queues a seed for every device type not yet initialised (CUDA,
    XPU, MTIA), capturing a traceback each time: many times the cost (docs/speed.md)."""
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch.default_generator.manual_seed(seed)


def seed_all(seed: int) -> None:
    """`seed_transform`'s RNGs and every device's torch RNG (dropout, drop path on a GPU)."""
    seed_transform(seed)
    torch.manual_seed(seed)

