"""`vit export --ckpt CKPT --format onnx|safetensors|ckpt --out DIR [--int8 static --calibration DATA]`.

Writes the checkpoint's evaluated weights (the EMA copy when training kept one) for use outside `vit`:

* ``onnx``: ``DIR/model.onnx`` (opset 18, dynamic batch axis; class names and image preparation in its
  metadata), checked against PyTorch with onnxruntime before it is written; ``--int8 static --calibration
  DATA`` adds ``DIR/model.int8.onnx``, calibrated QDQ int8 Linear layers (``--int8 dynamic``, or the old
  ``--quantize int8``: dynamic int8). `vit predict --ckpt DIR/model.onnx [--backend ...]` runs either.
* ``safetensors``: ``DIR/model.safetensors`` + ``DIR/config.json`` in timm's Hugging Face hub layout,
  so ``timm.create_model("local-dir:DIR", pretrained=True)`` rebuilds the model.
* ``hub``: the safetensors files plus ``DIR/README.md``, a model card written from the run (`vit.deploy.hub`);
  ``--push_to_hub owner/name [--private] [--revision BRANCH]`` uploads the folder with huggingface_hub.
* ``adapters``: a LoRA or DoRA checkpoint's adapters and head alone, ``DIR/adapters.safetensors``, with
  ``DIR/adapter_config.json`` (targets, rank, alpha, the base's source and sha256, model and classes).
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
from vit.checkpoints.lora import export_adapters
from vit.checkpoints.meta import expect_task
from vit.deploy.classifier import Classifier, read_classifier
from vit.files import out_problem

FORMATS = ("onnx", "safetensors", "hub", "ckpt", "adapters")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options of `vit export`."""
    parser = argparse.ArgumentParser(
        prog="vit export", description="Export a `vit fit` classifier checkpoint to ONNX, to timm's safetensors "
        "layout, or to one plain .ckpt (from a sharded FSDP folder), with its class names and image preparation.",
    )
    parser.add_argument("--ckpt", required=True, help="classifier checkpoint written by `vit fit` (a file, or "
                        "the folder of a sharded FSDP checkpoint)")
    parser.add_argument("--format", required=True, choices=FORMATS, help="onnx, safetensors, hub (safetensors "
                        "and a model card), ckpt (one file), or adapters (a LoRA checkpoint's adapters and head, and "
                        "their JSON)")
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
    parser.add_argument("--run", default=None, metavar="RUN_FOLDER",
                        help="hub only: the `vit fit` run folder (config.yaml, metrics.csv) the card reads; "
                        "default: found beside the checkpoint")
    parser.add_argument("--push_to_hub", default=None, metavar="OWNER/NAME",
                        help="hub only: upload the folder to this Hugging Face model repository (created if missing)")
    parser.add_argument("--private", action="store_true", help="--push_to_hub: create the repository private")
    parser.add_argument("--revision", default=None, help="--push_to_hub: the branch to commit to (default: main)")
    args = parser.parse_args(list(argv))
    if problem := out_problem(args.out, "folder"):
        parser.error(f"--out: {problem}")
    if args.format != "onnx" and (args.quantize or args.opset or args.int8):
        parser.error("--int8, --quantize and --opset apply to --format onnx only")
    hub_only = [f"--{k}" for k in ("run", "push_to_hub", "private", "revision") if getattr(args, k)]
    if args.format != "hub" and hub_only:
        parser.error(f"{', '.join(hub_only)} apply to --format hub only")
    if args.run and not Path(args.run, "metrics.csv").is_file():
        parser.error(f"--run {args.run}: not a `vit fit` run folder (no metrics.csv there)")
    if (args.private or args.revision) and not args.push_to_hub:
        parser.error("--private and --revision apply to --push_to_hub")
    if args.push_to_hub and args.push_to_hub.count("/") != 1:
        parser.error(f"--push_to_hub takes a repository id OWNER/NAME, got {args.push_to_hub!r}")
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
    if args.format == "adapters":
        files = export_adapters(read_checkpoint(args.ckpt), args.ckpt, args.out)
        print(f"wrote {', '.join(map(str, files))}")
        return files
    classifier = read_classifier(args.ckpt)
    if args.format == "hub":
        return export_hub(args, classifier)
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


def export_hub(args: argparse.Namespace, classifier: Classifier) -> list[Path]:
    """`vit export --format hub`: the folder and its card, then the upload when asked."""
    from vit.deploy.card import RunFacts, run_facts
    from vit.deploy.classifier import is_hub_model
    from vit.deploy.hub import export_hub as write_hub
    from vit.deploy.hub import push_folder

    shared = is_hub_model(args.ckpt)  # re-exporting a shared model: no run behind it here
    facts = RunFacts(Path(args.ckpt)) if shared else run_facts(read_checkpoint(args.ckpt), args.ckpt, args.run)
    files = write_hub(classifier, facts, args.out, name=args.push_to_hub)
    print(f"wrote {', '.join(map(str, files))}")
    print(f"model card numbers from {facts.run or 'no run folder (none found beside the checkpoint; --run names it)'}")
    print(f"load it with timm: timm.create_model('local-dir:{args.out}', pretrained=True); with transformers: "
          f"pipeline('image-classification', model='{args.out}')")
    if args.push_to_hub:
        url = push_folder(args.out, args.push_to_hub, private=args.private, revision=args.revision)
        print(f"pushed to {args.push_to_hub}: {url}")
    return files
