"""`vit predict --ckpt model.ckpt|model.onnx IMAGE_OR_FOLDER... [--out preds.csv|preds.json] [--top_k 5]`.

Classifies image files with a checkpoint from `vit fit`, or its ONNX export from `vit export`, on the
engine ``--backend`` names (`vit.deploy.backends`: torch, torch-bf16, torch-compile(-bf16), onnx, onnx-int8,
openvino(-bf16), openvino-int8, or auto: the fastest of them here within tolerance, measured once); the file
alone says how to prepare the images (size, channels, mean/std, crop) and what the classes are called. Folders are
searched recursively for image files. Writes one record per file:

    {"path": "photos/cat.jpg", "top_k": [{"class": 3, "name": "cat", "probability": 0.91}, ...], "error": null,
     "answer": "cat"}

A file that cannot be decoded gets ``"top_k": []`` and the reason in ``"error"``, and the run goes on
(``--strict`` stops at it instead). `vit attention` writes the same records, plus ``"png"``. The CSV
has the columns path, class_1, prob_1, ..., class_k, prob_k, answer, error: the classes are always the model's top
classes, the decision sits beside them. A calibrated checkpoint (the end of `vit fit`, or `vit calibrate`) or its
export answers calibrated probabilities (softmax(logits / T)); one with an unknown score (`--calibrate unknown`)
answers its unknown label for an image far from its training data: the record adds "unknown" and "score", the CSV
the column unknown_score, and "answer" (the column and the key) holds the unknown label there. ``--accept_all``
never answers unknown. ``--tta flip`` averages the logits of each image and its mirror (default: what calibration
chose on val). Imports no Lightning.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence

from vit.data.io import find_images
from vit.deploy.backends import AUTO, BACKENDS, load_classifier
from vit.deploy.classifier import is_multi_label
from vit.deploy.image_files import check_some_readable, describe_run, failures
from vit.deploy.inference import PRECISIONS, can_reject
from vit.deploy.predict import predict_files, write_predictions
from vit.files import out_problem


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options of `vit predict --ckpt`."""
    parser = argparse.ArgumentParser(
        prog="vit predict",
        description="Classify image files with a checkpoint from `vit fit` and write the top-k classes, one "
        "record per file. A file that cannot be read gets a record with its reason in the error field "
        "and is listed at the end; the exit status is non-zero only when no file could be read. "
        "(`vit predict --config ...` without --ckpt runs LightningCLI's predict on a datamodule.)",
    )
    parser.add_argument("--ckpt", required=True,
                        help="checkpoint written by `vit fit`, a .onnx file written by `vit export`, or a model "
                        "shared with `vit export --format hub`: its folder, or hf-hub:owner/name (the Hugging Face "
                        "cache, downloaded when online)")
    parser.add_argument("inputs", nargs="+", help="image files and/or folders (searched recursively)")
    parser.add_argument("--out", default="predictions.csv",
                        help="output .csv (path, class_1, prob_1, ..., answer, error) or .json (a list of "
                        '{"path", "top_k": [{"class", "name", "probability"}], "error"}) (default: %(default)s)')
    parser.add_argument("--top_k", type=int, default=5, help="classes per image (default: %(default)s)")
    parser.add_argument("--batch_size", type=int, default=64, help="images per batch (default: %(default)s)")
    parser.add_argument("--crop_pct", type=float, default=None,
                        help="centre-crop fraction (default: the one the checkpoint was evaluated with)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: %(default)s)")
    add_backend_argument(parser)
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                        help="deprecated: bf16 runs torch autocast; --backend torch-bf16 is faster (default: fp32)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the checkpoint's model (pays a compile on the first batch); "
                        "--backend torch-compile also freezes the weights, faster on a CPU")
    parser.add_argument("--strict", action="store_true",
                        help="stop at the first file that cannot be read, writing nothing")
    add_accept_all_argument(parser)
    add_tta_argument(parser)
    args = parser.parse_args(list(argv))
    if args.top_k < 1:
        parser.error(f"--top_k must be at least 1, got {args.top_k}")
    if problem := out_problem(args.out, "file"):
        parser.error(f"--out: {problem}")
    if args.precision != "fp32":
        warnings.warn("--precision bf16 is deprecated: --backend torch-bf16 casts the weights to bf16, faster than "
                      "autocast on CPUs with bf16 units", FutureWarning, stacklevel=2)
    return args


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """``--backend`` as `vit predict` and `vit serve` take it."""
    parser.add_argument("--backend", default=None, choices=(AUTO, *BACKENDS),
                        help="what runs the model: torch (eager fp32), torch-bf16 (AMX/AVX512-BF16 CPUs), "
                        "torch-compile(-bf16), onnx (onnxruntime), onnx-int8 and openvino-int8 (a model.int8.onnx "
                        "from `vit export --int8 static`), openvino(-bf16); auto times those that can run the file "
                        "here (<= 30 s, once: the choice is cached beside the file) and keeps the fastest whose "
                        "answers agree with eager fp32's (default: torch for a checkpoint, onnx or onnx-int8 for a "
                        ".onnx file)")


def add_accept_all_argument(parser: argparse.ArgumentParser) -> None:
    """``--accept_all`` as `vit predict` and `vit serve` take it."""
    parser.add_argument("--accept_all", action="store_true",
                        help="never answer 'unknown': a calibrated model (`vit calibrate`, or the end of `vit fit`) "
                        "otherwise answers its unknown label for images far from its training data")


def add_tta_argument(parser: argparse.ArgumentParser) -> None:
    """``--tta`` as `vit predict` and `vit serve` take it."""
    parser.add_argument("--tta", default=None, choices=("none", "flip"),
                        help="test-time augmentation: 'flip' averages the logits of each image and its mirror "
                        "(twice the compute; it can also turn right answers wrong, e.g. on digits); 'none' does "
                        "not (default: what `vit calibrate` chose by measuring val with and without; none for an "
                        "uncalibrated model)")


def rejection_note(classifier: object, path: str, accept_all: bool) -> str | None:
    """One line when the model cannot answer "unknown" (saved or exported before `vit calibrate`), else None."""
    if accept_all or is_multi_label(classifier):  # multi-label: "none of these" is no label
        return None
    if not can_reject(classifier):
        calibration = getattr(classifier, "calibration", None)
        if calibration is not None and calibration.threshold is None:  # T alone: `vit fit`'s default
            return (f"note: {path} answers calibrated probabilities (T = {calibration.temperature:.4g}) and never "
                    "'unknown' (it has no unknown score: `vit fit --calibrate unknown`, or `vit calibrate --ckpt "
                    "CKPT --config CFG` then export again, adds one)")
        return (f"note: {path} has no unknown score (saved or exported before calibration, or a backend that does "
                "not run it): every image gets one of its classes, and the probabilities are uncalibrated unless "
                "a temperature was stored; `vit calibrate --ckpt CKPT --config CFG`, then export again, adds them")
    return None


def sample_images(classifier: object, files: Sequence, crop_pct: float | None, count: int = 16) -> object:
    """Up to ``count`` of the files to predict, prepared for ``classifier``: what `--backend auto` times the
    backends on (None when none of the first few can be read: it then times on noise)."""
    import torch

    from vit.deploy.image_files import ImagePaths, Unreadable

    dataset = ImagePaths(files[:2 * count], classifier.eval_transform(crop_pct), classifier.image_mode,
                         classifier.eval_short_side(crop_pct))
    images = [image for _, image in (dataset[i] for i in range(len(dataset))) if not isinstance(image, Unreadable)]
    return torch.stack(images[:count]) if images else None


def main(argv: Sequence[str]) -> list[dict]:
    """Run `vit predict --ckpt ...` with the given arguments (without the command name); returns the records."""
    args = parse_args(argv)
    # The file first (a missing or uncached checkpoint is the first thing to say), except for auto, which times the
    # backends on the images to predict.
    found = find_images(args.inputs) if args.backend == AUTO else None
    classifier = load_classifier(args.ckpt, args.device, backend=args.backend, compile=args.compile,
                                 batch_size=args.batch_size, workload=len(found.files) if found else None,
                                 sample=lambda model: sample_images(model, found.files, args.crop_pct))
    found = found or find_images(args.inputs)
    for line in found.describe_skipped():
        print(line)
    if note := rejection_note(classifier, args.ckpt, args.accept_all):
        print(note)
    rows = predict_files(classifier, found.files, args.top_k, args.batch_size, args.crop_pct, args.precision,
                         strict=args.strict, accept_all=args.accept_all, tta=args.tta)
    out = write_predictions(rows, args.out)
    print(describe_run(f"wrote {len(rows) - len(failures(rows))} predictions to {out}", rows, out))
    check_some_readable(rows)
    return rows
