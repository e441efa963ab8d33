"""Pooled backbone features of a dataset, and their cache: shared by `vit probe` and `vit audit`, with the two
helpers both commands need (`blas_threads` for scikit-learn on the features, `new_run_folder` for the output).

    features, labels, how = cached_features(model, model_config, dataset, "train", cache_dir=...)

The features are the model's pooled, pre-logits output (``forward_head(forward_features(x), pre_logits=True)``),
float32 (N, D), in the dataset's order. The cache file is named by a hash of what they depend on: the
weights below the head with the model config (`weights_key`), and the dataset's ``fingerprint()`` (files
with sizes and modification times, or the arrays themselves, and the transform). A changed weight, file or
transform is a new key, so a stale cache is never read. Imports no Lightning.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from vit._graveyard import moved_name
from vit.data.protocol import Fingerprinted
from vit.files import save_atomic
from vit.hashing import digest
from vit.progress import progress

log = logging.getLogger(__name__)


def blas_threads(n: int, d: int) -> int:
    """BLAS threads for scikit-learn on n x d features: one for small problems, where OpenBLAS's threads cost
    far more than they save (docs/speed.md, "choices measured"), else torch's thread count (the config's
    ``num_threads``)."""
    return 1 if n * d < 1 << 22 else torch.get_num_threads()


def weights_key(model: nn.Module, config: dict[str, Any]) -> str:
    """A hash of what the pooled features depend on: the weights below the head (the model's ``head`` role,
    `vit.nn.roles`: a distilled ViT's ``head_dist`` too) and the model config."""
    h = hashlib.sha256()
    digest(h, {k: v for k, v in config.items() if k != "num_classes" and "drop" not in k})
    heads = model.param_roles().head if hasattr(model, "param_roles") else ("head",)
    for name, tensor in sorted(model.state_dict().items()):
        if not any(name == head or name.startswith(head + ".") for head in heads):
            digest(h, name)
            digest(h, tensor)
    return h.hexdigest()


def dataset_key(dataset: Dataset) -> str | None:
    """The dataset's ``fingerprint()``, or None for a dataset without one (its features are not cached)."""
    return dataset.fingerprint() if isinstance(dataset, Fingerprinted) else None


@torch.inference_mode()
def extract_features(
    model: nn.Module, dataset: Dataset, *, batch_size: int = 256, num_workers: int = 0,
    device: torch.device | str = "cpu", description: str = "features",
) -> tuple[Tensor, Tensor]:
    """Pooled pre-logits features (N, D) float32 and labels (N,) of a dataset, in order."""
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    features, labels = [], []
    for x, y in progress(loader, len(loader), description):
        tokens = model.forward_features(x.to(device))  # (B, N, D)
        features.append(model.forward_head(tokens, pre_logits=True).float().cpu())  # (B, D)
        labels.append(torch.as_tensor(y).long())
    return torch.cat(features), torch.cat(labels)


def cached_features(
    model: nn.Module, model_config: dict[str, Any], dataset: Dataset, split: str, *,
    cache_dir: Path | None, batch_size: int = 256, num_workers: int = 0, device: torch.device | str = "cpu",
    weights: str | None = None,
) -> tuple[Tensor, Tensor, str]:
    """A split's (features, labels) from the cache when there, else extracted and cached; and where they came
    from, in words. ``cache_dir=None`` extracts and caches nothing; ``weights`` is `weights_key`'s value, if
    the caller has it already (hashing the weights once per run, not once per split)."""
    data = None if cache_dir is None else dataset_key(dataset)
    path = None
    if data is not None:
        weights = weights or weights_key(model, model_config)
        path = Path(cache_dir) / f"{split}-{hashlib.sha256((weights + data).encode()).hexdigest()[:24]}.pt"
    if path is not None and path.is_file():
        try:
            cached = torch.load(path, map_location="cpu", weights_only=True)
            return cached["features"], cached["labels"], f"loaded from cache {path}"
        except Exception as e:  # unreadable: extract again and overwrite
            log.warning("ignoring unreadable feature cache %s (%s: %s)", path, type(e).__name__, e)
    features, labels = extract_features(model, dataset, batch_size=batch_size, num_workers=num_workers,
                                        device=device, description=f"features: {split}")
    if path is None:
        return features, labels, "extracted" + (" (not cached: the dataset has no fingerprint())"
                                                if cache_dir is not None else "")
    try:
        save_atomic(lambda f: torch.save({"features": features, "labels": labels}, f), path)  # honours the umask
    except OSError as e:  # a read-only or full disk costs the next run time, not this run's figures
        return features, labels, f"extracted, not cached ({type(e).__name__}: {e})"
    return features, labels, f"extracted, cached in {path}"


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # 0.1's `new_run_folder` (vit/_graveyard.py)
