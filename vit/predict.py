"""`vit predict --ckpt model.ckpt IMAGE_OR_FOLDER... [--out preds.csv|preds.json] [--top_k 5]`.

Classifies image files with a checkpoint from `vit fit`; the checkpoint alone says how to prepare the
images (size, channels, mean/std) and what the classes are called. Folders are searched recursively
for image files. Writes one row per image: the path, then the top-k class names and probabilities.
"""

from __future__ import annotations

import argparse
import csv
import json
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from vit.data.images import is_image_file, load_image, make_eval_transform
from vit.tasks.classify import ImageClassifier, load_classifier


def list_images(inputs: Sequence[str | Path]) -> list[Path]:
    """Image files among ``inputs`` (files, or folders searched recursively), in a stable order."""
    files: list[Path] = []
    skipped = 0
    for item in map(Path, inputs):
        if item.is_dir():
            for path in sorted(p for p in item.rglob("*") if p.is_file() and not p.name.startswith(".")):
                if is_image_file(path):
                    files.append(path)
                else:
                    skipped += 1
        elif item.is_file():
            files.append(item)
        else:
            raise FileNotFoundError(f"no such image file or folder: {item}")
    if skipped:
        warnings.warn(f"skipped {skipped} files that are not images", stacklevel=2)
    if not files:
        raise ValueError(f"no image files found in {', '.join(map(str, inputs))}")
    return files


def eval_transform(classifier: ImageClassifier, crop_pct: float | None = None) -> Callable:
    """The checkpoint's evaluation transform: resize (its interpolation), centre crop (its crop_pct),
    normalise (timm)."""
    return make_eval_transform(
        classifier.in_chans, tuple(classifier.img_size),
        classifier.crop_pct if crop_pct is None else crop_pct,
        classifier.interpolation, classifier.mean, classifier.std,
    )


class _Files(Dataset):
    def __init__(self, files: Sequence[Path], transform: Callable, mode: str) -> None:
        self.files, self.transform, self.mode = list(files), transform, mode

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.transform(load_image(self.files[index], mode=self.mode))


@torch.no_grad()
def predict_files(
    classifier: ImageClassifier, files: Sequence[Path], top_k: int = 5, batch_size: int = 64,
    crop_pct: float | None = None,
) -> list[dict]:
    """Top-k predictions per file: ``{"path", "classes": [...], "probs": [...]}``.

    ``crop_pct=None`` uses the centre crop the checkpoint was evaluated with.
    """
    top_k = min(top_k, len(classifier.class_names))
    mode = "L" if classifier.in_chans == 1 else "RGB"
    loader = DataLoader(_Files(files, eval_transform(classifier, crop_pct), mode), batch_size=batch_size)
    device = next(classifier.parameters()).device
    rows: list[dict] = []
    try:
        from rich.progress import track
    except ImportError:  # rich is a dependency, but prediction should not need it
        track = lambda it, **_: it
    for batch in track(loader, description="predicting", total=len(loader)):
        probs = classifier(batch.to(device)).softmax(dim=-1)
        values, indices = probs.topk(top_k, dim=-1)
        for p, idx in zip(values.tolist(), indices.tolist()):
            path = files[len(rows)]
            rows.append({
                "path": str(path), "classes": [classifier.class_names[i] for i in idx],
                "probs": [round(v, 6) for v in p],
            })
    return rows


def write_predictions(rows: Sequence[dict], out: str | Path) -> Path:
    """Write predictions as JSON (``.json``) or CSV (anything else: path, class_1, prob_1, ...)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".json":
        out.write_text(json.dumps(list(rows), indent=2))
        return out
    k = max(len(r["classes"]) for r in rows)
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path"] + [f"{name}_{i}" for i in range(1, k + 1) for name in ("class", "prob")])
        for r in rows:
            writer.writerow([r["path"]] + [v for pair in zip(r["classes"], r["probs"]) for v in pair])
    return out


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Command line: classify images with a checkpoint and write CSV/JSON."""
    parser = argparse.ArgumentParser(
        prog="vit predict",
        description="Classify image files with a checkpoint from `vit fit` and write the top-k classes. "
        "(`vit predict --config ...` without --ckpt runs LightningCLI's predict on a datamodule.)",
    )
    parser.add_argument("--ckpt", required=True, help="checkpoint written by `vit fit`")
    parser.add_argument("inputs", nargs="+", help="image files and/or folders (searched recursively)")
    parser.add_argument("--out", default="predictions.csv",
                        help="output .csv or .json (default: %(default)s)")
    parser.add_argument("--top_k", type=int, default=5, help="classes per image (default: %(default)s)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--crop_pct", type=float, default=None,
                        help="centre-crop fraction (default: the one the checkpoint was evaluated with)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.top_k < 1:
        parser.error(f"--top_k must be at least 1, got {args.top_k}")
    classifier = load_classifier(args.ckpt, map_location=args.device)
    files = list_images(args.inputs)
    rows = predict_files(classifier, files, args.top_k, args.batch_size, args.crop_pct)
    out = write_predictions(rows, args.out)
    print(f"wrote {len(rows)} predictions to {out}")
    return rows
