"""`vit attention`: draw where a trained model looks. Three modes, chosen by an option:

    vit attention --ckpt model.ckpt cat.jpg dog.png photos/ --out maps/          # attention maps (the default)
    vit attention --ckpt translate.ckpt --text "4 1 7 19 3" --out maps/          # a translation's attention
    vit attention --ckpt model.ckpt --faithfulness photos/ --out maps/           # do the maps mean anything?

The default mode writes ``maps/cat.png`` (layers x heads of cls-to-patch overlays, plus the rollout overlay),
and ``maps/predictions.json``: the records of `vit predict` (path, top_k, error) with the figure
added as ``"png"``. A file that cannot be read gets a record with its reason in ``"error"``
(``"png": null``) and the run goes on; ``--strict`` stops at it instead. Images are prepared as
`vit predict` prepares them (the checkpoint's size, centre crop, mean and std), so both
commands report the same classes; ``--native_size`` keeps each image's own size instead.
The preparation and the figure are `vit.explain.image`'s. ``--text`` runs `vit.commands.text_attention` and
``--faithfulness`` `vit.commands.faithfulness`, on the options parsed here (each adds its own group of them).
Every file is written atomically.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from vit.commands import faithfulness, text_attention
from vit.data.io import find_images
from vit.deploy.classifier import read_classifier
from vit.deploy.image_files import (
    ImagePaths,
    Unreadable,
    UnreadableImageError,
    check_some_readable,
    describe_run,
    failures,
)
from vit.deploy.inference import record
from vit.errors import UserValueError
from vit.explain.image import NATIVE_MAX_PATCHES, ROLLOUTS, explain_image, prepare_image
from vit.files import out_problem, save_atomic

USAGE = """vit attention --ckpt CKPT IMAGE [IMAGE ...] [--out DIR] [map options]
       vit attention --ckpt CKPT --text SENTENCE [SENTENCE ...] [--out DIR] [--text options]
       vit attention --ckpt CKPT --faithfulness IMAGE [IMAGE ...] [--out DIR] [--max_images N]"""
DESCRIPTION = """Where a trained model looks, in one of three modes:
  (default)       an image classifier's attention maps: for each image a PNG of every layer's and head's
                  cls-to-patch map with the rollout, and predictions.json with one record per file:
                  {"path", "top_k": [{"class", "name", "probability"}], "error", "png"}, as `vit predict`
                  writes. A file that cannot be read is reported and skipped; the exit status is non-zero
                  only when no file could be read.
  --text          a translation checkpoint's attention on each sentence: an alignment PNG, and attention.json
                  with the encoder, decoder and cross-attention weights and their token labels.
  --faithfulness  whether the classifier's maps mean anything: deletion and insertion AUCs against a random
                  order, and the model-randomisation check; printed and written to faithfulness.json."""
MAP_OPTIONS = ("rollout", "discard_ratio", "target_class", "top_k", "native_size", "alpha", "strict")
MODES = {  # mode -> the options (argparse dests) that apply to it, besides --ckpt, --out and --device
    "maps": ("layer", "head", *MAP_OPTIONS),
    "text": ("layer", "head", *text_attention.OPTIONS),
    "faithfulness": faithfulness.OPTIONS,
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of `vit attention`, every mode's options in it, in a group per mode."""
    parser = argparse.ArgumentParser(prog="vit attention", usage=USAGE, description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="*", type=Path, metavar="IMAGE",
                        help="image files, or folders searched recursively (not with --text)")
    parser.add_argument("--ckpt", required=True, type=Path,
                        help="checkpoint written by `vit fit`: a classifier's, or with --text a Translator's")
    parser.add_argument("--out", type=Path, default=Path("attention_maps"), help="output folder (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    modes = parser.add_argument_group("modes (one at most; without one: the attention maps of images)")
    chosen = modes.add_mutually_exclusive_group()
    chosen.add_argument("--text", nargs="+", default=None, metavar="SENTENCE",
                        help="draw a translation checkpoint's attention on these source sentences")
    chosen.add_argument("--faithfulness", action="store_true",
                        help="check the classifier's maps on the images: deletion/insertion AUCs and randomisation")
    add_map_options(parser)
    text_attention.add_options(parser)
    faithfulness.add_options(parser)
    return parser


def add_map_options(parser: argparse.ArgumentParser) -> None:
    """The options of the default mode, the attention maps of images."""
    group = parser.add_argument_group("attention maps (the default mode)")
    group.add_argument("--layer", nargs="+", type=int, default=None,
                       help="layers to draw (0-based, negative from the end); default: all. With --text: the "
                       "decoder layer of the alignment (default: the last)")
    group.add_argument("--head", nargs="+", default=None,
                       help="heads to draw (0-based), or 'mean' for the average of the heads; default: all. With "
                       "--text: the alignment's head, or 'mean' (the default)")
    group.add_argument("--rollout", choices=ROLLOUTS, default="mean",
                       help="attention rollout fusing heads by mean/max/min, gradient-weighted ('grad'), or none")
    group.add_argument("--discard_ratio", type=float, default=0.0,
                       help="rollout: drop this share of each row's lowest weights")
    group.add_argument("--target_class", default=None,
                       help="--rollout grad: class name or index (default: the predicted one)")
    group.add_argument("--top_k", type=int, default=5, help="how many classes to report")
    group.add_argument("--native_size", action="store_true",
                       help="keep each image's own size (rounded down to the patch size) instead of the checkpoint's "
                       "resize and crop; memory grows with the square of the number of patches, so a larger image "
                       f"is scaled down to at most {NATIVE_MAX_PATCHES} patches, keeping its shape")
    group.add_argument("--alpha", type=float, default=0.5, help="opacity of the heat map")
    group.add_argument("--strict", action="store_true",
                       help="stop at the first file that cannot be read, before writing predictions.json "
                       "(figures drawn so far stay); by default it is reported and skipped")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options of `vit attention`; ``mode`` says which of the three runs."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    args.mode = "text" if args.text is not None else "faithfulness" if args.faithfulness else "maps"
    flag = {"maps": "the attention maps of images", "text": "--text", "faithfulness": "--faithfulness"}[args.mode]
    for dest in sorted({d for options in MODES.values() for d in options} - set(MODES[args.mode])):
        if getattr(args, dest) != parser.get_default(dest):
            used = "--" + dest
            parser.error(f"{used} does not apply to {flag}; see `vit attention --help` for each mode's options")
    if problem := out_problem(args.out, "folder"):
        parser.error(f"--out: {problem}")
    {"maps": check_map_args, "text": text_attention.check_args, "faithfulness": faithfulness.check_args}[
        args.mode](parser, args)
    return args


def check_map_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what cannot run in the default mode."""
    if not args.images:
        parser.error("give image files or folders to draw the attention maps of (or --text SENTENCE ... for a "
                     "translation checkpoint)")
    if args.top_k < 1:
        parser.error(f"--top_k must be at least 1, got {args.top_k}")
    if not 0.0 <= args.discard_ratio < 1.0:
        parser.error(f"--discard_ratio must be in [0, 1), got {args.discard_ratio}")
    if args.target_class is not None and args.rollout != "grad":
        parser.error("--target_class only applies to --rollout grad")


def _parse_heads(heads: Sequence[str] | None, num_heads: int) -> list[int] | str | None:
    if heads is None:
        return None
    if list(heads) == ["mean"]:
        return "mean"
    chosen = []
    for head in heads:
        try:
            index = int(head)
        except ValueError:
            raise UserValueError(f"--head takes head numbers or 'mean', got {head!r}") from None
        if not -num_heads <= index < num_heads:
            raise UserValueError(f"--head {index}: the model has {num_heads} heads (0..{num_heads - 1})")
        chosen.append(index % num_heads)
    return chosen


def _target_index(target: str | None, class_names: Sequence[str]) -> int | None:
    if target is None:
        return None
    if target in class_names:
        return list(class_names).index(target)
    try:
        index = int(target)
    except ValueError:
        raise UserValueError(f"--target_class {target!r} is neither a class name nor an index") from None
    if not 0 <= index < len(class_names):
        raise UserValueError(f"--target_class {index} is out of range for {len(class_names)} classes")
    return index


def _output_names(images: Sequence[Path]) -> list[str]:
    """A distinct PNG name per input: a/x.jpg and b/x.jpg must not overwrite each other."""
    names: list[str] = []
    for path in images:
        name, n = path.stem, 2
        while name in names:
            name, n = f"{path.stem}_{n}", n + 1
        names.append(name)
    return names


def main(argv: Sequence[str]) -> list[dict] | dict:
    """Run `vit attention` with the given arguments (without the command name); returns the records (the
    numbers with --faithfulness)."""
    args = parse_args(argv)
    if args.mode == "text":
        return text_attention.run(args)
    if args.mode == "faithfulness":
        return faithfulness.run(args)
    return draw_maps(args)


def draw_maps(args: argparse.Namespace) -> list[dict]:
    """The default mode: a figure per image, and predictions.json; returns its records."""
    found = find_images(args.images)  # fails on a missing file before any work
    files = found.files
    classifier = read_classifier(args.ckpt, args.device)
    classifier.require_vit("attention maps", args.ckpt)
    model = classifier.model
    num_heads = model.blocks[0].attn.num_heads
    model.layer_indices(args.layer)  # a layer that does not exist stops the command before any work
    heads = _parse_heads(args.head, num_heads)
    target = _target_index(args.target_class, classifier.class_names)
    if args.native_size:
        model.dynamic_img_size = True  # position embeddings are resampled to each image's grid
    for line in found.describe_skipped():
        print(line)
    # The loader of `vit predict`, one image at a time (sizes differ with --native_size): a file that
    # cannot be decoded comes back as Unreadable instead of stopping the run.
    short_side = None if args.native_size else classifier.eval_short_side()
    images = ImagePaths(files, partial(prepare_image, classifier=classifier, native_size=args.native_size),
                        classifier.image_mode, short_side)

    results = []
    for index, (path, name) in enumerate(zip(files, _output_names(files))):
        _, image = images[index]  # decoded here: one image in memory at a time
        if isinstance(image, Unreadable):
            if args.strict:
                raise UnreadableImageError(f"cannot read {path}: {image.reason}")
            results.append({**record(path, error=image.reason), "png": None})
            print(f"{path}: cannot read: {image.reason}")
            continue
        image.tensor = image.tensor.to(args.device)
        fig, predictions = explain_image(
            model, image, class_names=classifier.class_names, layers=args.layer, heads=heads,
            rollout=args.rollout, discard_ratio=args.discard_ratio, target=target, top_k=args.top_k,
            alpha=args.alpha, title=path.name,
        )
        png = save_atomic(lambda f, fig=fig: fig.savefig(f, format="png", dpi=100), args.out / f"{name}.png")
        # the answer `vit predict` gives a model without an unknown score: its top class (no score is run here)
        results.append({**record(path, predictions), "answer": predictions[0]["name"], "png": str(png)})
        ranked = ", ".join(f"{p['name']} {p['probability']:.1%}" for p in predictions)
        print(f"{path}: {ranked}  -> {png}")

    summary = save_atomic(lambda f: f.write(json.dumps(results, indent=2).encode()), args.out / "predictions.json")
    written = len(results) - len(failures(results))
    print(describe_run(f"wrote {written} figure(s) and {summary}", results, summary))
    check_some_readable(results)
    return results
