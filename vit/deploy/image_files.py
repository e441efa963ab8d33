"""Image files for a prediction run (`vit predict`, `vit attention`): batches of the files that decode, a record
with the reason for each file that does not, and the run's summary. Imports no Lightning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from PIL import UnidentifiedImageError
from torch import Tensor
from torch.utils.data import Dataset

from vit.data.io import check_image_file, load_image
from vit.errors import UserError
from vit.preprocessing import too_elongated


# ---- reading files, bad ones included ---------------------------------------------------------
class Unreadable(NamedTuple):
    """Stands in for the tensor of a file that could not be decoded, so the batch goes on without it."""

    reason: str


class UnreadableImageError(UserError, OSError):
    """An image file that cannot be decoded (with --strict), or no file at all that can be."""


def read_failure(path: str | Path, error: Exception) -> str:
    """Why ``path`` could not be decoded, in a few words (the path itself is said elsewhere)."""
    cause = error.__cause__ or error
    if isinstance(cause, UnidentifiedImageError):
        # PIL's "cannot identify image file '...'" repeats the path; the header check says what it is
        return check_image_file(str(path)) or "not an image in a format PIL reads"
    if isinstance(cause, OSError) and cause.strerror:  # no such file, permission denied, ...
        return cause.strerror
    return str(cause) or type(cause).__name__  # e.g. "image file is truncated (49 bytes not processed)"


class ImagePaths(Dataset):
    """Image files decoded in the model's mode and prepared by ``transform``; a file that cannot be
    decoded yields `Unreadable` in place of its tensor, so one bad file costs one row, not the run.

    With ``short_side`` (what ``transform`` scales the short side to), so does an image that scaling would blow
    up (`vit.preprocessing.too_elongated`); and a large JPEG is decoded at the scale the resize needs
    (`vit.data.io.load_image`).
    """

    def __init__(self, files: Sequence[Path], transform: Callable, mode: str, short_side: int | None = None) -> None:
        self.files, self.transform, self.mode, self.short_side = list(files), transform, mode, short_side

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[int, Tensor | Unreadable]:
        try:
            image = load_image(self.files[index], mode=self.mode, short_side=self.short_side)
        except OSError as e:  # load_image turns every decoding failure into an OSError
            return index, Unreadable(read_failure(self.files[index], e))
        if self.short_side and (problem := too_elongated(*image.size, self.short_side)):
            return index, Unreadable(problem)
        return index, self.transform(image)


@dataclass
class Batch:
    """A batch of `ImagePaths` items: the decoded images stacked, the failures set aside."""

    indices: list[int]  # file index of each row of ``images``
    images: Tensor | None  # (B, C, H, W); None when no file of the batch could be decoded
    failed: list[tuple[int, str]]  # (file index, reason)


def collate_readable(items: Sequence[tuple[int, Tensor | Unreadable]]) -> Batch:
    """Stack the decoded images of a batch and keep the unreadable ones apart (runs in the workers)."""
    good = [(i, x) for i, x in items if not isinstance(x, Unreadable)]
    failed = [(i, x.reason) for i, x in items if isinstance(x, Unreadable)]
    images = torch.stack([x for _, x in good]) if good else None
    return Batch([i for i, _ in good], images, failed)


# ---- records ----------------------------------------------------------------------------------
def failures(rows: Sequence[dict]) -> list[tuple[str, str]]:
    """(path, reason) of the records whose file could not be read."""
    return [(r["path"], r["error"]) for r in rows if r["error"]]


def describe_run(written: str, rows: Sequence[dict], out: Path, shown: int = 10) -> str:
    """The closing summary: what was written, then the unreadable files and why, the first ``shown`` of them."""
    bad = failures(rows)
    if not bad:
        return written
    where = "field" if out.suffix.lower() == ".json" else "column"
    noun = "file" if len(bad) == 1 else "files"
    lines = [f"{written}; {len(bad)} {noun} could not be read (the reason is in the error {where} of {out}):"]
    lines += [f"  {path}: {reason}" for path, reason in bad[:shown]]
    if len(bad) > shown:
        lines.append(f"  ... and {len(bad) - shown} more")
    return "\n".join(lines)


def check_some_readable(rows: Sequence[dict]) -> None:
    """Raise `UnreadableImageError` (for `vit`: exit status 1) when not one file could be read."""
    if rows and len(failures(rows)) == len(rows):
        noun = "file" if len(rows) == 1 else "files"
        raise UnreadableImageError(f"none of the {len(rows)} image {noun} could be read")
