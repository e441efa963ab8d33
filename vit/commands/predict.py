"""`vit predict --ckpt model.ckpt|model.onnx IMAGE_OR_FOLDER... [--out preds.csv|preds.json] [--top_k 5]`.

Classifies image files with a checkpoint from `vit fit`, or its ONNX export from `vit export` (run by
onnxruntime); the file alone says how to prepare the images (size, channels, mean/std, crop) and what
the classes are called. Folders are searched recursively for image files. Writes one row per image:
the path, then the top-k class names and probabilities. Imports no Lightning.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from vit.checkpoint import Classifier
from vit.data.io import list_images, load_image
from vit.inference import PRECISIONS, OnnxClassifier, autocast, load_model


class ImagePaths(Dataset):
    """Image files decoded in the model's mode and prepared by ``transform``."""

    def __init__(self, files: Sequence[Path], transform: Callable, mode: str) -> None:
        self.files, self.transform, self.mode = list(files), transform, mode

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.transform(load_image(self.files[index], mode=self.mode))


def progress(iterable, total: int, description: str):
    """A rich progress bar over ``iterable`` (rich comes with the package; plain iteration without it)."""
    try:
        from rich.progress import track
    except ImportError:
        return iterable
    return track(iterable, description=description, total=total)


@torch.no_grad()
def predict_files(
    classifier: Classifier | OnnxClassifier, files: Sequence[Path], top_k: int = 5, batch_size: int = 64,
    crop_pct: float | None = None, precision: str = "fp32",
) -> list[dict]:
    """Top-k predictions per file: ``{"path", "classes": [...], "probs": [...]}``.

    ``crop_pct=None`` uses the centre crop the model was evaluated with; ``precision="bf16"`` runs a torch
    model under autocast.
    """
    if precision != "fp32" and isinstance(classifier, OnnxClassifier):
        raise ValueError(f"{classifier.path}: precision {precision!r} is for checkpoints (torch autocast); "
                         "an ONNX export runs as exported (fp32, or int8 with `vit export --quantize int8`)")
    top_k = min(top_k, len(classifier.class_names))
    mode = "L" if classifier.in_chans == 1 else "RGB"
    loader = DataLoader(ImagePaths(files, classifier.eval_transform(crop_pct), mode), batch_size=batch_size)
    rows: list[dict] = []
    for batch in progress(loader, len(loader), "predicting"):
        with autocast(precision, classifier.device):
            logits = classifier(batch.to(classifier.device))
        probs = logits.float().softmax(dim=-1)
        values, indices = probs.topk(top_k, dim=-1)
        for p, idx in zip(values.tolist(), indices.tolist()):
            rows.append({
                "path": str(files[len(rows)]), "classes": [classifier.class_names[i] for i in idx],
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


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options of `vit predict --ckpt`."""
    parser = argparse.ArgumentParser(
        prog="vit predict",
        description="Classify image files with a checkpoint from `vit fit` and write the top-k classes. "
        "(`vit predict --config ...` without --ckpt runs LightningCLI's predict on a datamodule.)",
    )
    parser.add_argument("--ckpt", required=True,
                        help="checkpoint written by `vit fit`, or a .onnx file written by `vit export`")
    parser.add_argument("inputs", nargs="+", help="image files and/or folders (searched recursively)")
    parser.add_argument("--out", default="predictions.csv", help="output .csv or .json (default: %(default)s)")
    parser.add_argument("--top_k", type=int, default=5, help="classes per image (default: %(default)s)")
    parser.add_argument("--batch_size", type=int, default=64, help="images per batch (default: %(default)s)")
    parser.add_argument("--crop_pct", type=float, default=None,
                        help="centre-crop fraction (default: the one the checkpoint was evaluated with)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: %(default)s)")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                        help="bf16: torch autocast (fast only where the CPU/GPU has bf16 units; default: fp32)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the checkpoint's model (pays a compile on the first batch)")
    args = parser.parse_args(list(argv))
    if args.top_k < 1:
        parser.error(f"--top_k must be at least 1, got {args.top_k}")
    return args


def main(argv: Sequence[str]) -> list[dict]:
    """Run `vit predict --ckpt ...` with the given arguments (without the command name)."""
    args = parse_args(argv)
    classifier = load_model(args.ckpt, args.device, compile=args.compile)
    files = list_images(args.inputs)
    rows = predict_files(classifier, files, args.top_k, args.batch_size, args.crop_pct, args.precision)
    out = write_predictions(rows, args.out)
    print(f"wrote {len(rows)} predictions to {out}")
    return rows
