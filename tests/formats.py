"""Writers of small datasets in their real on-disk formats, for the data and CLI tests.

The CIFAR "python version" files are Python 2 pickles of dicts with str keys; read by Python 3 with
``encoding="latin1"`` (as torchvision does), their keys are str, so that is what we write (protocol 2).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file


def write_cifar10(root: Path, per_batch: int = 20, n_test: int = 20, seed: int = 0) -> dict:
    """torchvision's cifar-10-batches-py: data_batch_1..5, test_batch, batches.meta (pickles)."""
    from vit.data.cifar import CIFAR10_CLASSES

    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    written = {}
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = [int(i % 10) for i in range(n)]
        with open(folder / name, "wb") as f:
            pickle.dump({"batch_label": name, "data": data, "labels": labels}, f, protocol=2)
        written[name] = (data, labels)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": list(CIFAR10_CLASSES), "num_vis": 3072}, f, protocol=2)
    return written


def write_cifar100(root: Path, n_train: int = 200, n_test: int = 100, seed: int = 0) -> dict:
    """torchvision's cifar-100-python: train, test, meta (pickles with fine and coarse labels)."""
    from vit.data.cifar import CIFAR100_CLASSES

    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    written = {}
    for name, n in [("train", n_train), ("test", n_test)]:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        fine = [int(i % 100) for i in range(n)]
        with open(folder / name, "wb") as f:
            entry = {"data": data, "fine_labels": fine, "coarse_labels": [c // 5 for c in fine]}
            pickle.dump(entry, f, protocol=2)
        written[name] = (data, fine)
    with open(folder / "meta", "wb") as f:
        pickle.dump({
            "fine_label_names": list(CIFAR100_CLASSES),
            "coarse_label_names": [f"coarse{i}" for i in range(20)],
        }, f, protocol=2)
    return written


def random_rgb(size: int = 12, seed: int = 0) -> Image.Image:
    """A small random RGB image."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def image_in_mode(mode: str, size: int = 12, seed: int = 0) -> Image.Image:
    """A small random image in one of PIL's common modes."""
    rgb = random_rgb(size, seed)
    if mode == "I;16":
        rng = np.random.default_rng(seed)
        return Image.fromarray(rng.integers(0, 65536, (size, size), dtype=np.uint16))
    if mode == "P":
        return rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    return rgb.convert(mode)


# mode -> file suffix that can store it
MODE_FILES = {
    "RGB": ".jpg", "L": ".png", "P": ".png", "RGBA": ".png", "CMYK": ".jpg", "I;16": ".png",
    "1": ".bmp", "LA": ".png",
}


def write_class_folders(
    root: Path, classes: Sequence[str], per_class: int, modes: Sequence[str] = ("RGB",), size: int = 12,
    seed: int = 0,
) -> list[Path]:
    """root/<class>/img_<i>.<ext>, cycling through ``modes``; returns the written files."""
    files = []
    k = seed
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            mode = modes[(i + len(files)) % len(modes)]
            path = root / c / f"img_{i}{MODE_FILES[mode]}"
            image_in_mode(mode, size, seed=k).save(path)
            files.append(path)
            k += 1
    return files


# English-French pairs in the style of the Anki/Tatoeba export, for the text tests.
CORPUS = [
    ("Go.", "Va !"),
    ("Hi there.", "Salut toi."),
    ("The cat sleeps.", "Le chat dort."),
    ("The dog runs fast.", "Le chien court vite."),
    ("I like green tea.", "J'aime le thé vert."),
    ("We are here.", "Nous sommes là."),
]


def write_hf_cache(cache: Path, repo_id: str, filename: str, state_dict: dict[str, torch.Tensor]) -> Path:
    """A Hugging Face hub cache entry written by hand, in huggingface_hub's own layout:
    ``models--<org>--<name>/{refs/main, blobs/<sha256>, snapshots/<commit>/<filename> -> ../../blobs/<sha256>}``."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    tmp = repo / "blobs" / "incoming"
    if filename.endswith(".safetensors"):
        save_file(state_dict, tmp)
    else:
        torch.save(state_dict, tmp)
    blob = repo / "blobs" / hashlib.sha256(tmp.read_bytes()).hexdigest()
    tmp.rename(blob)
    commit = "5f2c0e1d9b8a7c6d5e4f3a2b1c0d9e8f7a6b5c4d"
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / filename).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return repo
