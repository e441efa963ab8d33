"""Score a classifier on a labelled folder (one sub-folder a class, named as a class): top-1 and the confusion
matrix, what `vit zeroshot --eval` shows before anyone labels more."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from vit.data.io import class_folders, scan_class_folders
from vit.deploy.image_files import ImagePaths, collate_readable
from vit.errors import UserPathError, UserValueError


@dataclass
class FolderScore:
    """Top-1 over ``count`` images and the confusion matrix (rows: true class, columns: predicted)."""

    top1: float
    count: int
    confusion: torch.Tensor
    class_names: list[str]
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (file, why), left out of the score

    def table(self) -> str:
        """The confusion matrix as aligned text, classes in the classifier's order."""
        width = max(6, *(len(n) for n in self.class_names))
        lines = [" " * width + " " + " ".join(f"{n[:width]:>{width}}" for n in self.class_names)]
        for name, row in zip(self.class_names, self.confusion.tolist()):
            lines.append(f"{name:>{width}} " + " ".join(f"{v:>{width}}" for v in row))
        return "\n".join(lines)


def labelled_images(folder: str | os.PathLike, class_names: list[str]) -> list[tuple[Path, int]]:
    """(image, class index) for every image under ``folder``/<class name>/, found as a training folder's are
    (`vit.data.io.scan_class_folders`: hidden files, links and non-images skipped); a sub-folder naming no class is an
    error, a class without a sub-folder is not."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserPathError(f"--eval {folder}: not a folder (expected one sub-folder of images per class)")
    index = {n: i for i, n in enumerate(class_names)}
    present = class_folders(folder) if any(p.is_dir() for p in folder.iterdir()) else []
    for name in present:
        if name not in index:
            raise UserValueError(f"--eval {folder}: sub-folder {name!r} is not one of the classes "
                                 f"({', '.join(class_names)})")
    found = [(Path(p), index[present[k]]) for p, k in scan_class_folders(folder, present, allow_empty=True)]
    if not found:
        raise UserValueError(f"--eval {folder}: no images in sub-folders named after the classes")
    return found


@torch.no_grad()
def score_folder(classifier: torch.nn.Module, folder: str | os.PathLike, batch_size: int = 32) -> FolderScore:
    """Run a `vit.deploy.Classifier` over a labelled folder. A file that cannot be read is reported in
    ``unreadable`` and left out of the score, as `vit predict` leaves it out of its rows (`ImagePaths`)."""
    names = list(classifier.class_names)
    items = labelled_images(folder, names)
    dataset = ImagePaths([p for p, _ in items], classifier.eval_transform(), classifier.image_mode,
                         classifier.eval_short_side())
    confusion = torch.zeros(len(names), len(names), dtype=torch.long)
    unreadable = []
    for batch in DataLoader(dataset, batch_size=batch_size, collate_fn=collate_readable):
        unreadable += [(str(items[i][0]), reason) for i, reason in batch.failed]
        if batch.images is None:
            continue
        predicted = classifier(batch.images.to(classifier.device)).argmax(dim=-1).cpu()
        for i, guess in zip(batch.indices, predicted.tolist()):
            confusion[items[i][1], guess] += 1
    if not confusion.sum():
        raise UserValueError(f"--eval {folder}: none of its {len(items)} images could be read (first: "
                             f"{unreadable[0][0]}: {unreadable[0][1]})")
    return FolderScore(float(confusion.diag().sum() / confusion.sum()), int(confusion.sum()), confusion, names,
                       unreadable)
