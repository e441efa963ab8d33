"""Hugging Face data written as users get it, for the tests: `save_to_disk`, Hub-layout Parquet, and a Hub cache
laid out by hand as huggingface_hub lays it (refs/main, blobs/<sha256>, snapshots/<commit>/... -> blobs)."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def digits(per_class: int = 30) -> tuple[list[bytes], list[int]]:
    """The first ``per_class`` digits of each class (sklearn's), as 8x8 PNG bytes, in class order."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images, labels = [], []
    for c in range(10):
        for i in np.flatnonzero(d.target == c)[:per_class]:
            images.append(png(np.clip(d.images[i] * 16, 0, 255).astype(np.uint8)))
            labels.append(c)
    return images, labels


def write_folder(root: Path, images: Sequence[bytes], labels: Sequence[int]) -> list[str]:
    """root/<label>/<k>.png, in the rows' order (so the rows are in the folder's sorted order); returns the paths."""
    paths = []
    for k, (data, label) in enumerate(zip(images, labels)):
        path = root / str(label) / f"{k:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        paths.append(str(path))
    return paths


def dataset(images: Sequence[bytes], labels: Sequence, class_label: Sequence[str] | None = None, multi: bool = False):
    """A `datasets.Dataset` of an Image column and labels: a ClassLabel (or a Sequence of one), or plain values."""
    import datasets

    label = datasets.ClassLabel(names=list(class_label)) if class_label is not None else None
    if multi:
        label = datasets.Sequence(label) if label is not None else datasets.Sequence(datasets.Value("string"))
    elif label is None:
        label = datasets.Value("string") if isinstance(labels[0], str) else datasets.Value("int64")
    features = datasets.Features({"image": datasets.Image(), "label": label})
    return datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images], "label": list(labels)},
                                      features=features)


def write_parquet(root: Path, splits: dict[str, object]) -> Path:
    """root/data/<split>-00000-of-00001.parquet per split, as the Hub lays a dataset out."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    for name, ds in splits.items():
        ds.to_parquet(str(root / "data" / f"{name}-00000-of-00001.parquet"))
    return root


def write_hub_cache(hf_home: Path, repo_id: str, splits: dict[str, object]) -> Path:
    """The dataset ``repo_id`` in HF_HOME/hub as huggingface_hub caches it; returns the snapshot folder."""
    repo = hf_home / "hub" / f"datasets--{repo_id.replace('/', '--')}"
    staged = write_parquet(hf_home / "staging", splits)
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / COMMIT
    for f in sorted((staged / "data").iterdir()):
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        f.rename(blob)
        (snapshot / "data").mkdir(parents=True, exist_ok=True)
        (snapshot / "data" / f.name).symlink_to(Path("../../..") / "blobs" / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot
