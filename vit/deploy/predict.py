"""Predicting image files: a model from `vit.deploy` over paths, one record per file, and the records written.

A file that cannot be decoded gets a record with the reason, and the run goes on; `vit predict`, the
tests and notebooks call `predict_files`. Imports no Lightning.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from vit.deploy.classifier import Classifier
from vit.deploy.image_files import ImagePaths, UnreadableImageError, collate_readable
from vit.deploy.inference import OnnxClassifier, answered, autocast, chosen_tta, record
from vit.errors import UserValueError
from vit.files import save_atomic
from vit.progress import progress


# ---- predicting -------------------------------------------------------------------------------
@torch.no_grad()
def predict_files(
    classifier: Classifier | OnnxClassifier, files: Sequence[Path], top_k: int = 5, batch_size: int = 64,
    crop_pct: float | None = None, precision: str = "fp32", *, strict: bool = False, num_workers: int = 0,
    accept_all: bool = False, tta: str | None = None,
) -> list[dict]:
    """One `record` per file, in the order of ``files``: the top-k classes, or the reason it could not be read.

    ``crop_pct=None`` uses the centre crop the model was evaluated with; ``precision="bf16"`` runs a torch
    model under autocast; ``strict`` raises `UnreadableImageError` at the first file that cannot be read.
    A calibrated model's probabilities are softmax(logits / T), and its records say whether each image is
    unknown (`vit.deploy.inference.answered`); ``accept_all`` never answers unknown; ``tta`` ("none", "flip"; None:
    what calibration chose on val) averages the logits over the image and its mirror.
    """
    if precision != "fp32" and isinstance(classifier, OnnxClassifier):
        raise UserValueError(f"{classifier.path}: precision {precision!r} is for checkpoints (torch autocast); "
                             "an ONNX export runs as exported (fp32, or int8 with `vit export --int8 static`)")
    if precision != "fp32" and not isinstance(classifier, Classifier):
        raise UserValueError(f"--precision {precision} applies to --backend torch; --backend "
                             f"{classifier.backend} runs in its own precision")
    top_k = min(top_k, len(classifier.class_names))
    chosen_tta(classifier, tta)  # a refused --tta: one line before any image is read
    # an image too elongated for the resize is one row's error
    dataset = ImagePaths(files, classifier.eval_transform(crop_pct), classifier.image_mode,
                         classifier.eval_short_side(crop_pct))
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_readable)
    rows: list[dict | None] = [None] * len(dataset)
    for batch in progress(loader, len(loader), "predicting"):
        for index, reason in batch.failed:
            if strict:
                raise UnreadableImageError(f"cannot read {dataset.files[index]}: {reason}")
            rows[index] = record(dataset.files[index], error=reason)
        if batch.images is None:
            continue
        with autocast(precision, classifier.device):
            answers = answered(classifier, batch.images.to(classifier.device), top_k, accept_all, tta)
        for index, (entries, extra) in zip(batch.indices, answers):
            rows[index] = record(dataset.files[index], entries) | extra
    return rows


def write_predictions(rows: Sequence[dict], out: str | Path) -> Path:
    """Write records as JSON (``.json``) or CSV (anything else), atomically: a kill mid-write leaves the old file or
    the new one. The CSV's columns: path, class_1, prob_1, ..., class_k, prob_k (always the model's top classes),
    then the decision: answer (the class, or the unknown label) and, for a model with an unknown score,
    unknown_score; then error. A multi-label model's adds labels and label_probs after path, ";"-separated."""
    if Path(out).suffix.lower() == ".json":
        return save_atomic(lambda f: f.write(json.dumps(list(rows), indent=2).encode()), out)
    k = max((len(r["top_k"]) for r in rows), default=0)
    answers = any("answer" in r for r in rows)  # a single-label model: its decision beside its classes
    scored = any("score" in r for r in rows)  # a model with an unknown score
    labelled = any("labels" in r for r in rows)  # a multi-label model: the labels over their thresholds first
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(["path", *(["labels", "label_probs"] if labelled else []),
                     *(f"{name}_{i}" for i in range(1, k + 1) for name in ("class", "prob")),
                     *(["answer"] if answers else []), *(["unknown_score"] if scored else []), "error"])
    for r in rows:
        lead = [r["path"]]
        if labelled:
            labels = r.get("labels", [])
            lead += [";".join(e["name"] for e in labels), ";".join(str(e["probability"]) for e in labels)]
        cells = [v for entry in r["top_k"] for v in (entry["name"], entry["probability"])]
        extra = ([r.get("answer", "")] if answers else []) + ([r.get("score", "")] if scored else [])
        writer.writerow([*lead, *cells, *[""] * (2 * k - len(cells)), *extra, r["error"] or ""])
    return save_atomic(lambda f: f.write(text.getvalue().encode()), out)
