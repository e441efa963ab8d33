"""`vit zeroshot`: a classifier from class names alone, written as an ordinary checkpoint.

    vit zeroshot --model vit_base_patch16_clip_224.openai --classes "oak,maple,birch" --out zs
    vit zeroshot --model ./my_openclip_folder --classes_file classes.txt --templates simple --out zs --eval photos/
    vit predict --ckpt zs/zeroshot.ckpt photos/      # and serve, export, attention, probe, calibrate

``--model``: a timm tag whose hub repo carries the OpenCLIP weights, an OpenCLIP/OpenAI/transformers file, or a
folder laid out as the hub's (`vit.checkpoints.clip`). ``--templates``: a named set (openai: OpenAI's 80 ImageNet
prompts, CLIP's default; simple: their 7; generic: 4 short ones, SigLIP's default; photo: "a photo of a {}.") or a
file, one template a line with one ``{}``. ``--eval FOLDER`` (a sub-folder of images per class) prints top-1 and
the confusion matrix. The library does the work (`vit.checkpoints.zeroshot`, `vit.deploy.zeroshot`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vit.data.clip_text import TEMPLATES
from vit.errors import UserPathError

CHECKPOINT_NAME = "zeroshot.ckpt"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="vit zeroshot", allow_abbrev=False,
        description="Build a classifier from class names with a CLIP or SigLIP model: the image tower, and a head of "
        "the names' text embeddings averaged over prompt templates. Writes a checkpoint every command reads.")
    parser.add_argument("--model", required=True, help="timm tag (hub cache), OpenCLIP/OpenAI/transformers file, "
                        "or a folder laid out as the hub's (open_clip_config.json, weights, tokenizer files)")
    names = parser.add_mutually_exclusive_group(required=True)
    names.add_argument("--classes", help='comma-separated class names: "oak,maple,birch"')
    names.add_argument("--classes_file", help="a file with one class name a line")
    parser.add_argument("--templates", default=None,
                        help=f"a named set ({', '.join(TEMPLATES)}) or a file, one template with one {{}} a line "
                        "(default: openai for CLIP, generic for SigLIP)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder or tokenizer.json (default: beside the "
                        "weights)")
    parser.add_argument("--out", required=True, help=f"folder for {CHECKPOINT_NAME}")
    parser.add_argument("--eval", default=None, metavar="FOLDER",
                        help="a labelled folder (one sub-folder per class) to score: top-1 and a confusion matrix")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(list(argv))


def read_classes(args: argparse.Namespace) -> list[str]:
    """The class names from ``--classes`` or ``--classes_file``."""
    if args.classes is not None:
        return args.classes.split(",")
    path = Path(args.classes_file)
    if not path.is_file():
        raise UserPathError(f"--classes_file {path}: no such file")
    return path.read_text(encoding="utf-8").splitlines()


def main(argv: Sequence[str]) -> dict[str, Any]:
    """Run `vit zeroshot`; returns the checkpoint's path and, with --eval, the score."""
    args = parse_args(argv)
    from vit.checkpoints.zeroshot import class_names

    classes = class_names(read_classes(args))  # before the model loads: a mistake costs nothing
    from vit.checkpoints.clip import load_clip
    from vit.checkpoints.io import save_checkpoint
    from vit.checkpoints.zeroshot import zero_shot_checkpoint
    from vit.data.clip_text import read_templates

    loaded = load_clip(args.model, args.tokenizer)
    templates = read_templates(args.templates, loaded.model.family)
    loaded.model.to(args.device)
    checkpoint = zero_shot_checkpoint(loaded, classes, templates, args.batch_size)
    out = save_checkpoint(checkpoint, Path(args.out) / CHECKPOINT_NAME)
    print(f"{loaded.model.family} zero-shot classifier of {len(classes)} classes ({len(templates)} templates) "
          f"saved to {out} (vit predict --ckpt {out} IMAGES)")
    result: dict[str, Any] = {"checkpoint": str(out)}
    if args.eval:
        from vit.data.io import describe_bad_files
        from vit.deploy.classifier import read_classifier
        from vit.deploy.zeroshot import score_folder

        score = score_folder(read_classifier(out, args.device), args.eval, args.batch_size)
        print(f"{args.eval}: top-1 {score.top1:.4f} on {score.count} images\nconfusion (rows: true, columns: "
              f"predicted):\n{score.table()}")
        if score.unreadable:  # reported and left out, as vit predict does
            print(describe_bad_files(score.unreadable, score.count + len(score.unreadable)) + "\n(left out of top-1)")
        result |= {"top1": score.top1, "confusion": score.confusion.tolist(), "unreadable": score.unreadable}
    return result
