"""`vit export --ckpt CKPT --format onnx|safetensors|ckpt --out DIR [--int8 static --calibration DATA]`.

Writes the checkpoint's evaluated weights (the EMA copy when training kept one) for use outside `vit`:

* ``onnx``: ``DIR/model.onnx`` (opset 18, dynamic batch axis; class names and image preparation in its
  metadata), checked against PyTorch with onnxruntime before it is written; ``--int8 static --calibration
  DATA`` adds ``DIR/model.int8.onnx``, calibrated QDQ int8 Linear layers (``--int8 dynamic``, or the old
  ``--quantize int8``: dynamic int8). `vit predict --ckpt DIR/model.onnx [--backend ...]` runs either.
* ``safetensors``: ``DIR/model.safetensors`` + ``DIR/config.json`` in timm's Hugging Face hub layout,
  so ``timm.create_model("local-dir:DIR", pretrained=True)`` rebuilds the model.
* ``ckpt``: ``DIR/model.ckpt``, the checkpoint as one file (weights and metadata, no optimiser state): how a
  sharded FSDP checkpoint folder becomes a file every other command reads. Any format reads such a folder.

Imports no Lightning.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from vit.checkpoints.io import read_checkpoint, save_checkpoint
from vit.checkpoints.meta import expect_task
from vit.deploy.classifier import read_classifier
from vit.files import out_problem

FORMATS = ("onnx", "safetensors", "ckpt")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options of `vit export`."""
    parser = argparse.ArgumentParser(
        prog="vit export", description="Export a `vit fit` classifier checkpoint to ONNX, to timm's safetensors "
        "layout, or to one plain .ckpt (from a sharded FSDP folder), with its class names and image preparation.",
    )
    parser.add_argument("--ckpt", required=True, help="classifier checkpoint written by `vit fit` (a file, or "
                        "the folder of a sharded FSDP checkpoint)")
    parser.add_argument("--format", required=True, choices=FORMATS, help="onnx, safetensors, or ckpt (one file)")
    parser.add_argument("--out", required=True, help="output folder (created if needed): model.onnx (and "
                        "model.int8.onnx), model.safetensors with config.json, or model.ckpt")
    parser.add_argument("--int8", choices=["static", "dynamic"], default=None,
                        help="onnx only: also write model.int8.onnx, its Linear layers in int8: static (calibrated "
                        "on --calibration; onnxruntime and OpenVINO run it) or dynamic (no calibration, slower)")
    parser.add_argument("--calibration", default=None, metavar="FOLDER_OR_CONFIG",
                        help="--int8 static: a folder of training images (its train/ subfolder if there is one), "
                        "or the `vit fit` config the checkpoint was trained with (its training split)")
    parser.add_argument("--calibration_images", type=int, default=None,
                        help="--int8 static: how many calibration images, drawn at random (default: 300)")
    parser.add_argument("--quantize", choices=["int8"], default=None,
                        help="deprecated: the same as --int8 dynamic")
    parser.add_argument("--opset", type=int, default=None, help="onnx only: ONNX opset (default: 18)")
    args = parser.parse_args(list(argv))
    if problem := out_problem(args.out, "folder"):
        parser.error(f"--out: {problem}")
    if args.format != "onnx" and (args.quantize or args.opset or args.int8):
        parser.error("--int8, --quantize and --opset apply to --format onnx only")
    if args.quantize and args.int8:
        parser.error("--quantize int8 is the old name of --int8 dynamic: give one of them")
    args.int8 = args.int8 or ("dynamic" if args.quantize else None)
    if args.int8 == "static" and not args.calibration:
        parser.error("--int8 static needs --calibration: a folder of a few hundred training images, or the "
                     "`vit fit` config the checkpoint was trained with (e.g. --calibration configs/digits.yaml); "
                     "a checkpoint does not record its data")
    if args.calibration and args.int8 != "static":
        parser.error("--calibration applies to --int8 static")
    if args.calibration_images is not None and args.calibration_images < 1:
        parser.error(f"--calibration_images must be at least 1, got {args.calibration_images}")
    return args


def main(argv: Sequence[str]) -> list[Path]:
    """Run `vit export` with the given arguments (without the command name); returns the files written."""
    from vit.deploy import export

    args = parse_args(argv)
    if args.format == "onnx":
        export.need_onnx()  # before the checkpoint is read: fail fast when the extra is missing
    if args.format == "ckpt":
        checkpoint = read_checkpoint(args.ckpt)
        expect_task(checkpoint, "classify", args.ckpt)
        path = save_checkpoint(checkpoint, Path(args.out) / "model.ckpt")
        print(f"wrote {path} ({len(checkpoint['state_dict'])} tensors, no optimiser state): vit predict, vit test "
              "--ckpt_path and --model.init_args.pretrained read it")
        return [path]
    classifier = read_classifier(args.ckpt)
    if args.format == "safetensors":
        files = export.export_safetensors(classifier, args.out)
        config = json.loads(Path(args.out, "config.json").read_text())  # what was written
        print(f"wrote {', '.join(map(str, files))} (timm architecture {config['architecture']}"
              f"{' with model_args' if 'model_args' in config else ''}, {config['num_classes']} classes)")
        print(f"load it with timm: timm.create_model('local-dir:{args.out}', pretrained=True)")
        return files
    calibration = None
    if args.int8 == "static":
        from vit.cli.data import calibration_images
        from vit.deploy.quantize import CALIBRATION_IMAGES

        calibration = calibration_images(args.calibration, classifier.eval_transform(), classifier.image_mode,
                                         args.calibration_images or CALIBRATION_IMAGES)
    checks = export.export_onnx(classifier, args.out, quantize=args.int8, opset=args.opset or export.OPSET,
                                calibration=calibration)
    for check in checks:
        print(f"wrote {check}")
    if calibration is not None:
        from vit.deploy.cpu import describe_cpu, reduce_range_for

        print(f"calibrated on {len(calibration)} images from {args.calibration}; "
              f"{'7-bit' if reduce_range_for() else '8-bit'} weights for this CPU ({describe_cpu()})")
    return [check.path for check in checks]
