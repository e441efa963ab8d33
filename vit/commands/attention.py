"""`vit attention`: draw where a trained classifier looks, for each image, and print its top classes.

    vit attention --ckpt model.ckpt cat.jpg dog.png photos/ --out maps/

writes ``maps/cat.png`` (layers x heads of cls-to-patch overlays, plus the rollout overlay),
and ``maps/predictions.json``: the records of `vit predict` (path, top_k, error) with the figure
added as ``"png"``. A file that cannot be read gets a record with its reason in ``"error"``
(``"png": null``) and the run goes on; ``--strict`` stops at it instead. Images are prepared as
`vit predict` prepares them (the checkpoint's size, centre crop, mean and std), so both
commands report the same classes; ``--native_size`` keeps each image's own size instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image
from torch import Tensor
from torchvision.transforms import v2

from vit.data.io import find_images
from vit.deploy.classifier import Classifier, read_classifier
from vit.deploy.image_files import (
    ImagePaths,
    Unreadable,
    UnreadableImageError,
    check_some_readable,
    describe_run,
    failures,
)
from vit.deploy.inference import record, top_k_entries
from vit.errors import UserValueError
from vit.explain.maps import collect_attention, gradient_rollout, rollout_streaming
from vit.explain.plot import plot_attention, to_display_image
from vit.files import out_problem
from vit.nn.vision import VisionTransformer
from vit.preprocessing import eval_short_side

ROLLOUTS = ("mean", "max", "min", "grad", "none")
DISPLAY_SIDE = 224  # small inputs (8x8 digits) are drawn larger, with visible pixels
NATIVE_MAX_PATCHES = 4096  # --native_size: 64 x 64 patches (1024 x 1024 pixels at 16 px a patch)


@dataclass
class PreparedImage:
    """One input: the normalised tensor the model sees and the same pixels for display."""

    tensor: Tensor  # (1, C, H, W), normalised
    display: np.ndarray  # (H', W', 3) in [0, 1], the model's input scaled up for drawing


def _other_mode(argv: Sequence[str]) -> ModuleType | None:
    """The module of `vit attention --text` (a translation checkpoint) or `--faithfulness`, if asked for."""
    if any(arg == "--text" or arg.startswith("--text=") for arg in argv):
        return importlib.import_module("vit.commands.text_attention")
    if "--faithfulness" in argv:
        return importlib.import_module("vit.commands.faithfulness")
    return None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options of `vit attention`."""
    other = _other_mode(argv)
    if other is not None:
        return other.parse_args(argv)
    parser = argparse.ArgumentParser(
        prog="vit attention",
        description="Write attention-map overlays for each image, and predictions.json with one record per "
        'file: {"path", "top_k": [{"class", "name", "probability"}], "error", "png"}, as `vit predict` writes. '
        "A file that cannot be read is reported and skipped; the exit status is non-zero only when no file "
        "could be read.",
    )
    parser.add_argument("images", nargs="+", type=Path, help="image files, or folders searched recursively")
    parser.add_argument("--ckpt", required=True, type=Path, help="checkpoint written by `vit fit`")
    parser.add_argument(
        "--out", type=Path, default=Path("attention_maps"), help="output folder (default: %(default)s)"
    )
    parser.add_argument(
        "--layer", nargs="+", type=int, default=None,
        help="layers to draw (0-based, negative from the end); default: all",
    )
    parser.add_argument(
        "--head", nargs="+", default=None,
        help="heads to draw (0-based), or 'mean' for the average of the heads; default: all",
    )
    parser.add_argument(
        "--rollout", choices=ROLLOUTS, default="mean",
        help="attention rollout fusing heads by mean/max/min, gradient-weighted ('grad'), or none",
    )
    parser.add_argument(
        "--discard_ratio", type=float, default=0.0, help="rollout: drop this share of each row's lowest weights",
    )
    parser.add_argument(
        "--target_class", default=None, help="--rollout grad: class name or index (default: the predicted one)",
    )
    parser.add_argument("--top_k", type=int, default=5, help="how many classes to report")
    parser.add_argument(
        "--native_size", action="store_true",
        help="keep each image's own size (rounded down to the patch size) instead of the checkpoint's "
        f"resize and crop; memory grows with the square of the number of patches, so a larger image is scaled "
        f"down to at most {NATIVE_MAX_PATCHES} patches, keeping its shape",
    )
    parser.add_argument("--alpha", type=float, default=0.5, help="opacity of the heat map")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    parser.add_argument("--strict", action="store_true",
                        help="stop at the first file that cannot be read, before writing predictions.json "
                        "(figures drawn so far stay); by default it is reported and skipped")
    args = parser.parse_args(list(argv))
    if args.top_k < 1:
        parser.error(f"--top_k must be at least 1, got {args.top_k}")
    if problem := out_problem(args.out, "folder"):
        parser.error(f"--out: {problem}")
    if not 0.0 <= args.discard_ratio < 1.0:
        parser.error(f"--discard_ratio must be in [0, 1), got {args.discard_ratio}")
    if args.target_class is not None and args.rollout != "grad":
        parser.error("--target_class only applies to --rollout grad")
    return args


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


def prepare_image(image: Image.Image, classifier: Classifier, *, native_size: bool = False) -> PreparedImage:
    """Normalise a decoded image (in the model's mode, L or RGB) with the checkpoint's mean/std.

    By default it is resized and centre-cropped exactly as `vit predict` does; with
    ``native_size`` it keeps its own size, rounded down to a multiple of the patch size.
    """
    if native_size:
        ph, pw = classifier.model.patch_size
        # attention memory grows with the square of the patches: a 6000x6000 photo (140,625 patches at 16 px)
        # asked for 40 TB; over NATIVE_MAX_PATCHES the image is scaled down, keeping its shape
        scale = min(1.0, math.sqrt(NATIVE_MAX_PATCHES / max(1, (image.height // ph) * (image.width // pw))))
        size = [max(ph, int(image.height * scale) // ph * ph), max(pw, int(image.width * scale) // pw * pw)]
        pixels = v2.functional.to_dtype(v2.functional.to_image(image), torch.float32, scale=True)
        pixels = v2.functional.resize(pixels, size, antialias=True)  # (C, H, W) in [0, 1]
        tensor = v2.functional.normalize(pixels, list(classifier.mean), list(classifier.std))
    else:
        tensor = classifier.eval_transform()(image)  # (C, H, W), normalised
    display = to_display_image(tensor, classifier.mean, classifier.std, min_side=DISPLAY_SIDE)
    return PreparedImage(tensor=tensor[None], display=display)


def explain_image(
    model: VisionTransformer,
    prepared: PreparedImage,
    *,
    class_names: Sequence[str],
    layers: Sequence[int] | None,
    heads: list[int] | str | None,
    rollout: str,
    discard_ratio: float,
    target: int | None,
    top_k: int,
    alpha: float,
    title: str,
) -> tuple[Figure, list[dict]]:
    """The figure for one image and its top-k predictions as dicts (class, name, probability)."""
    maps = collect_attention(model, prepared.tensor, layers=layers)
    cls_maps = maps.cls_maps()[:, 0]  # (L, H, h, w) of the one image
    if heads == "mean":
        cls_maps, head_labels = cls_maps.mean(dim=1, keepdim=True), ["mean"]
    elif heads is not None:
        cls_maps, head_labels = cls_maps[:, heads], heads
    else:
        head_labels = list(range(cls_maps.shape[1]))

    heat, label = None, None
    if rollout == "grad":
        _, heat = gradient_rollout(model, prepared.tensor, target, discard_ratio=discard_ratio)
        label = f"grad rollout → {class_names[target] if target is not None else 'predicted'}"
    elif rollout != "none":
        _, heat = rollout_streaming(model, prepared.tensor, head_fusion=rollout, discard_ratio=discard_ratio)
        label = f"rollout ({rollout})"

    probs, indices = maps.top_k(top_k)
    predictions = top_k_entries(probs[0].tolist(), indices[0].tolist(), class_names)
    best = predictions[0]
    fig = plot_attention(
        prepared.display, cls_maps, layers=maps.layers, heads=head_labels,
        rollout=None if heat is None else heat[0], rollout_label=label or "",
        title=f"{title}: {best['name']} ({best['probability']:.0%})", alpha=alpha,
    )
    return fig, predictions


def _output_names(images: Sequence[Path]) -> list[str]:
    """A distinct PNG name per input: a/x.jpg and b/x.jpg must not overwrite each other."""
    names: list[str] = []
    for path in images:
        name, n = path.stem, 2
        while name in names:
            name, n = f"{path.stem}_{n}", n + 1
        names.append(name)
    return names


def main(argv: Sequence[str]) -> list[dict]:
    """Run `vit attention` with the given arguments (without the command name); returns the records."""
    other = _other_mode(argv)
    if other is not None:
        return other.main(argv)
    args = parse_args(argv)
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
    mode = "L" if classifier.in_chans == 1 else "RGB"
    # The loader of `vit predict`, one image at a time (sizes differ with --native_size): a file that
    # cannot be decoded comes back as Unreadable instead of stopping the run.
    short_side = None if args.native_size else eval_short_side(classifier.img_size, classifier.crop_pct)
    images = ImagePaths(files, partial(prepare_image, classifier=classifier, native_size=args.native_size), mode,
                        short_side)

    args.out.mkdir(parents=True, exist_ok=True)
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
        png = args.out / f"{name}.png"
        fig.savefig(png, dpi=100)
        results.append({**record(path, predictions), "png": str(png)})
        ranked = ", ".join(f"{p['name']} {p['probability']:.1%}" for p in predictions)
        print(f"{path}: {ranked}  -> {png}")

    summary = args.out / "predictions.json"
    summary.write_text(json.dumps(results, indent=2))
    written = len(results) - len(failures(results))
    print(describe_run(f"wrote {written} figure(s) and {summary}", results, summary))
    check_some_readable(results)
    return results
