"""Hashing values of any kind (tensors, arrays, JSON-able values) by their bytes, type and shape.

Cache keys are built from it: a dataset's fingerprint (`vit.data.fingerprint`) and a model's weights
(`vit.features.weights_key`).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from torch import Tensor


def digest(h: Any, value: Any) -> None:
    """Feed ``value`` (a tensor, an array, or anything JSON can write) into the hash ``h``, with its type and
    shape, so that equal bytes of another shape hash differently."""
    if isinstance(value, Tensor):
        h.update(f"{value.dtype}{tuple(value.shape)}".encode())
        h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, np.ndarray):
        h.update(f"{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    else:
        h.update(json.dumps(value, sort_keys=True, default=str).encode())
