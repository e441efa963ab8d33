"""Score a classifier on a labelled folder (one sub-folder a class, named as a class): top-1 and the confusion
matrix, what `vit zeroshot --eval` shows before anyone labels more."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from vit.data.io import IMAGE_EXTENSIONS
from vit.errors import UserPathError, UserValueError


@dataclass
class FolderScore:
    """Top-1 over ``count`` images and the confusion matrix (rows: true class, columns: predicted)."""

    top1: float
    count: int
    confusion: torch.Tensor
    class_names: list[str]

    def table(self) -> str:
        """The confusion matrix as aligned text, classes in the classifier's order."""
        width = max(6, *(len(n) for n in self.class_names))
        lines = [" " * width + " " + " ".join(f"{n[:width]:>{width}}" for n in self.class_names)]
        for name, row in zip(self.class_names, self.confusion.tolist()):
            lines.append(f"{name:>{width}} " + " ".join(f"{v:>{width}}" for v in row))
        return "\n".join(lines)


def labelled_images(folder: str | os.PathLike, class_names: list[str]) -> list[tuple[Path, int]]:
    """(image, class index) for every image under ``folder``/<class name>/; a sub-folder naming no class is an error."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserPathError(f"--eval {folder}: not a folder (expected one sub-folder of images per class)")
    index = {n: i for i, n in enumerate(class_names)}
    found = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if sub.name not in index:
            raise UserValueError(f"--eval {folder}: sub-folder {sub.name!r} is not one of the classes "
                                 f"({', '.join(class_names)})")
        found += [(p, index[sub.name]) for p in sorted(sub.rglob("*")) if p.suffix.lower() in IMAGE_EXTENSIONS]
    if not found:
        raise UserValueError(f"--eval {folder}: no images in sub-folders named after the classes")
    return found


@torch.no_grad()
def score_folder(classifier: torch.nn.Module, folder: str | os.PathLike, batch_size: int = 32) -> FolderScore:
    """Run a `vit.deploy.Classifier` over a labelled folder."""
    names = list(classifier.class_names)
    items = labelled_images(folder, names)
    transform = classifier.eval_transform()
    confusion = torch.zeros(len(names), len(names), dtype=torch.long)
    for i in range(0, len(items), batch_size):
        chunk = items[i:i + batch_size]
        images = torch.stack([transform(Image.open(p).convert(classifier.image_mode)) for p, _ in chunk])
        predicted = classifier(images.to(classifier.device)).argmax(dim=-1).cpu()
        for (_, truth), guess in zip(chunk, predicted.tolist()):
            confusion[truth, guess] += 1
    return FolderScore(float(confusion.diag().sum() / confusion.sum()), len(items), confusion, names)
