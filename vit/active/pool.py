"""The pool `vit select` chooses from: its image files, their features, their near-duplicates, and what it writes.

    files = pool_files("photos/")                              # every image under the folder, in a stable order
    model = feature_model(ckpt=..., model=..., pretrained=...)  # a `Classifier`: a trained one, or a backbone
    features, probabilities, readable = pool_features(model, files)
    followers = duplicate_followers(files[readable])           # `vit audit`'s near-duplicates: all but one of each
    write_labels_file(out, files, picks); write_grid(out.with_suffix(".png"), files, picks)

The labels file is `vit.data.LabelsFile`'s format: ``file_name`` (relative to the file's folder when the image lies
under it, else absolute), an empty ``label`` to fill in, and ``reason``, which `vit fit` ignores. Imports no
Lightning.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from vit.active.choose import Pick
from vit.data.io import find_images
from vit.deploy.classifier import Classifier
from vit.errors import UserPathError, UserValueError


def pool_files(root: str | os.PathLike) -> list[Path]:
    """Every image file under ``root`` (absolute paths, sorted); one line of error for a missing or empty pool."""
    root = Path(root)
    if not root.is_dir():
        raise UserPathError(f"--from {root}: no such folder; give the folder of images to choose from")
    try:
        return [p.resolve() for p in find_images([root]).files]
    except UserValueError:
        raise UserValueError(f"--from {root}: the pool holds no images (.jpg, .png, ...); nothing to choose from"
                             ) from None


def feature_model(ckpt: str | None = None, model: str | None = None, pretrained: str | None = None,
                  global_pool: str | None = None) -> Classifier:
    """The network whose features choose: a `vit fit` checkpoint (its calibrated probabilities serve later rounds),
    or a named model with ``pretrained`` weights (an MAE checkpoint of `vit pretrain`, a timm tag, a file), pooled
    as ``global_pool`` says (default: the model's own; "avg" for an MAE, whose cls token nothing trained)."""
    from vit.checkpoints.io import read_checkpoint
    from vit.checkpoints.meta import META_KEY
    from vit.deploy.classifier import read_classifier

    if ckpt is not None:
        meta = read_checkpoint(ckpt, mmap=True).get(META_KEY) or {}
        if meta.get("task") not in (None, "classify"):
            raise UserValueError(f"--ckpt {ckpt} holds a {meta.get('task')} checkpoint, not a classifier; for its "
                                 f"encoder's features: --model {meta.get('model_name', 'NAME')} --pretrained {ckpt}")
        return read_classifier(ckpt)
    from vit.checkpoints.pretrained_cfg import pretrained_preprocessing
    from vit.checkpoints.weights import load_pretrained
    from vit.nn.vision import create_model
    from vit.preprocessing import Preprocessing

    found = pretrained_preprocessing(str(pretrained), model) if pretrained else None
    values = found[0] if found else {}
    overrides = {"img_size": values["img_size"]} if "img_size" in values else {}
    network = create_model(model, **overrides, **({"global_pool": global_pool} if global_pool else {}))
    if pretrained:
        load_pretrained(network, pretrained)
    prep = Preprocessing.for_channels(network.in_chans, values.get("mean"), values.get("std"),
                                      values.get("crop_pct", 1.0), values.get("interpolation", "bicubic"))
    names = [str(c) for c in range(network.num_classes)]
    return Classifier(network, model_name=model, class_names=names, mean=prep.mean, std=prep.std,
                      crop_pct=prep.crop_pct, interpolation=prep.interpolation).eval()


@torch.inference_mode()
def pool_features(model: Classifier, files: Sequence[Path], *, batch_size: int = 128, num_workers: int = 0,
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features (R, D), calibrated probabilities (R, C), indices into ``files`` of the R readable images)."""
    from vit.deploy.image_files import ImagePaths, collate_readable

    dataset = ImagePaths(files, model.eval_transform(), model.image_mode, model.eval_short_side())
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_readable)
    temperature = model.calibration.temperature if model.calibration is not None else 1.0
    features, probabilities, readable = [], [], []
    for batch in loader:
        if batch.images is None:
            continue
        tokens = model.model.forward_features(batch.images.to(model.device))  # (B, N, D)
        pooled = model.model.forward_head(tokens, pre_logits=True)  # (B, D)
        features.append(pooled.float().cpu())
        probabilities.append(torch.softmax(model.model.forward_head(tokens).float() / temperature, -1).cpu())
        readable += batch.indices
    if not readable:
        raise UserValueError("no image of the pool could be read; check the files (vit audit lists bad ones)")
    return torch.cat(features).numpy(), torch.cat(probabilities).numpy(), np.array(readable)


class _Files:
    """``item_name(i)`` and ``raw_image(i)`` of a list of files: what `vit.audit.scan` reads."""

    def __init__(self, files: Sequence[Path]) -> None:
        self.files = [str(f) for f in files]

    def __len__(self) -> int:
        return len(self.files)

    def item_name(self, index: int) -> str:
        return self.files[index]

    def raw_image(self, index: int) -> Any:
        from vit.data.io import open_image

        return open_image(self.files[index])


def duplicate_followers(files: Sequence[Path], num_workers: int = 1) -> np.ndarray:
    """A mask of the images `vit audit` finds exact or near copies of an earlier image of ``files``: each group of
    copies keeps its first image, so a batch never asks for the same picture twice."""
    from vit.audit.duplicates import find_duplicates
    from vit.audit.scan import EditedThumbnails, scan_split

    dataset = _Files(files)
    records = scan_split(dataset, "pool", [0] * len(files), num_workers)
    good = [r for r in records if r.problem is None]
    thumbs = np.stack([r.thumb for r in good]) if good else np.zeros((0, 3, 32, 32), np.uint8)
    pairs, _ = find_duplicates([r.content for r in good], [r.phash for r in good], [r.windows for r in good],
                               [r.luma for r in good], thumbs, EditedThumbnails(good, {"pool": dataset}))
    followers = np.zeros(len(files), bool)
    for a, b, *_ in sorted(pairs):  # i < j: the later image of a pair follows the earlier, unless that one does
        first, second = good[a].index, good[b].index
        if not followers[first]:
            followers[second] = True
    return followers


def labelled_mask(table: str | os.PathLike, files: Sequence[Path]) -> np.ndarray:
    """Which pool images a labels file (`vit.data.LabelsFile`'s format) names; an image it names outside the pool is
    a one-line error."""
    from vit.data.rows import read_table

    table = Path(table)
    if not table.is_file():
        raise UserPathError(f"--labelled {table}: no such file")
    rows = read_table(table, check_files=False, split_column=None)
    where = {str(f): i for i, f in enumerate(files)}
    mask = np.zeros(len(files), bool)
    outside = []
    for path in rows.paths:
        index = where.get(str(Path(path).resolve()))
        if index is None:
            outside.append(path)
        else:
            mask[index] = True
    if outside:
        raise UserValueError(f"--labelled {table} names {len(outside)} image(s) outside the pool (e.g. {outside[0]}); "
                             "give the labels file of this pool's images")
    return mask


def write_labels_file(out: str | os.PathLike, files: Sequence[Path], picks: Sequence[Pick]) -> Path:
    """The labels file to fill in: file_name, an empty label, reason; paths relative to its folder where they can be."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = out.parent.resolve()
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["file_name", "label", "reason"])
        for pick in picks:
            path = files[pick.index]
            name = path.relative_to(folder).as_posix() if path.is_relative_to(folder) else str(path)
            writer.writerow([name, "", pick.reason])
    return out


def write_grid(out: str | os.PathLike, files: Sequence[Path], picks: Sequence[Pick], side: int = 96) -> Path:
    """A PNG contact sheet of the chosen images, in the labels file's order (row-major), numbered."""
    from PIL import Image, ImageDraw

    from vit.data.io import load_image

    columns = max(1, min(10, len(picks)))
    rows = (len(picks) + columns - 1) // columns
    sheet = Image.new("RGB", (columns * side, rows * side), "white")
    draw = ImageDraw.Draw(sheet)
    for n, pick in enumerate(picks):
        image = load_image(files[pick.index])
        image.thumbnail((side - 4, side - 4))
        x, y = (n % columns) * side, (n // columns) * side
        sheet.paste(image, (x + 2, y + 2))
        draw.text((x + 3, y + 2), str(n + 1), fill="red")
    sheet.save(out)
    return Path(out)
