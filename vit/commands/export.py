"""`vit export --ckpt logs/digits/checkpoints/last.ckpt --format onnx|safetensors --out DIR [--quantize int8]`.

Writes the checkpoint's evaluated weights (the EMA copy when training kept one) for use outside `vit`:

* ``onnx``: ``DIR/model.onnx`` (opset 18, dynamic batch axis; class names and image preparation in its
  metadata), checked against PyTorch with onnxruntime before it is written; ``--quantize int8`` adds
  ``DIR/model.int8.onnx`` with int8 Linear layers. `vit predict --ckpt DIR/model.onnx` runs either.
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

from vit.checkpoint import expect_task, load_classifier, read_checkpoint, save_checkpoint

FORMATS = ("onnx", "safetensors", "ckpt")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options of `vit export`."""
    parser = argparse.ArgumentParser(
        prog="vit export", description="Export a `vit fit` classifier checkpoint to ONNX or to timm's safetensors "
        "layout, with its class names and image preparation.",
    )
    parser.add_argument("--ckpt", required=True, help="classifier checkpoint written by `vit fit` (a file, or "
                        "the folder of a sharded FSDP checkpoint)")
    parser.add_argument("--format", required=True, choices=FORMATS, help="onnx, safetensors, or ckpt (one file)")
    parser.add_argument("--out", required=True, help="output folder (created if needed)")
    parser.add_argument("--quantize", choices=["int8"], default=None,
                        help="onnx only: also write model.int8.onnx, Linear layers quantised dynamically to int8")
    parser.add_argument("--opset", type=int, default=None, help="onnx only: ONNX opset (default: 18)")
    args = parser.parse_args(list(argv))
    if args.format != "onnx" and (args.quantize or args.opset):
        parser.error("--quantize and --opset apply to --format onnx only")
    return args


def main(argv: Sequence[str]) -> list[Path]:
    """Run `vit export` with the given arguments (without the command name); returns the files written."""
    from vit import export

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
    classifier = load_classifier(args.ckpt)
    if args.format == "safetensors":
        files = export.export_safetensors(classifier, args.out)
        config = json.loads(Path(args.out, "config.json").read_text())  # what was written
        print(f"wrote {', '.join(map(str, files))} (timm architecture {config['architecture']}"
              f"{' with model_args' if 'model_args' in config else ''}, {config['num_classes']} classes)")
        print(f"load it with timm: timm.create_model('local-dir:{args.out}', pretrained=True)")
        return files
    checks = export.export_onnx(classifier, args.out, quantize=args.quantize, opset=args.opset or export.OPSET)
    for check in checks:
        print(f"wrote {check}")
    return [check.path for check in checks]
