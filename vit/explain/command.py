"""`vit attention`: draw where a trained classifier looks, for each image, and print its top classes.

    vit attention --ckpt model.ckpt cat.jpg dog.png --out maps/

writes ``maps/cat.png`` (layers x heads of cls-to-patch overlays, plus the rollout overlay),
and ``maps/predictions.json`` with the top-k classes of every image.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from vit.explain.maps import collect_attention, gradient_rollout, rollout_streaming
from vit.explain.plot import plot_attention
from vit.nn.vision import VisionTransformer

log = logging.getLogger(__name__)

ROLLOUTS = ("mean", "max", "min", "grad", "none")
DISPLAY_SIDE = 224  # small inputs (8x8 digits) are drawn larger, with visible pixels


@dataclass
class PreparedImage:
    """One input: the normalised tensor the model sees and the same pixels for display."""

    tensor: Tensor  # (1, C, H, W), normalised
    display: np.ndarray  # (H', W', 3) in [0, 1], the model's input scaled up for drawing


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options of `vit attention`."""
    parser = argparse.ArgumentParser(
        prog="vit attention",
        description="Write attention-map overlays and the top-k classes for each image.",
    )
    parser.add_argument("images", nargs="+", type=Path, help="image files (any format Pillow reads)")
    parser.add_argument("--ckpt", required=True, type=Path, help="checkpoint written by `vit fit`")
    parser.add_argument("--out", type=Path, default=Path("attention_maps"), help="output folder")
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
        "--discard-ratio", type=float, default=0.0, help="rollout: drop this share of each row"
    )
    parser.add_argument(
        "--target-class", default=None,
        help="--rollout grad: class name or index (default: the predicted one)",
    )
    parser.add_argument("--top-k", type=int, default=5, help="how many classes to report")
    parser.add_argument(
        "--native-size", action="store_true",
        help="keep each image's own size (rounded to the patch size) instead of resizing to the "
        "model's; memory grows with the square of the number of patches",
    )
    parser.add_argument("--alpha", type=float, default=0.5, help="opacity of the heat map")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    args = parser.parse_args(list(argv))
    if args.top_k < 1:
        parser.error(f"--top-k must be at least 1, got {args.top_k}")
    if not 0.0 <= args.discard_ratio < 1.0:
        parser.error(f"--discard-ratio must be in [0, 1), got {args.discard_ratio}")
    if args.target_class is not None and args.rollout != "grad":
        parser.error("--target-class only applies to --rollout grad")
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
            raise ValueError(f"--head takes head numbers or 'mean', got {head!r}") from None
        if not -num_heads <= index < num_heads:
            raise ValueError(f"--head {index}: the model has {num_heads} heads (0..{num_heads - 1})")
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
        raise ValueError(f"--target-class {target!r} is neither a class name nor an index") from None
    if not 0 <= index < len(class_names):
        raise ValueError(f"--target-class {index} is out of range for {len(class_names)} classes")
    return index


def load_image(
    path: Path,
    *,
    in_chans: int,
    size: tuple[int, int] | None,
    patch_size: tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
) -> PreparedImage:
    """Read an image, convert it to the model's channels, resize and normalise it.

    ``size=None`` keeps the image's own size, rounded down to a multiple of the patch size.
    """
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    try:
        with Image.open(path) as raw:
            image = raw.convert({1: "L", 3: "RGB"}[in_chans])
    except UnidentifiedImageError:
        raise ValueError(f"{path}: not an image Pillow can read (corrupt or unknown format)") from None
    except KeyError:
        raise ValueError(
            f"the model takes {in_chans} channels; only 1 (L) or 3 (RGB) are supported"
        ) from None
    if size is None:
        ph, pw = patch_size
        size = (max(ph, image.height // ph * ph), max(pw, image.width // pw * pw))
    if (image.height, image.width) != tuple(size):
        image = image.resize((size[1], size[0]), Image.Resampling.BICUBIC)

    pixels = np.asarray(image, dtype=np.float32) / 255.0  # (H, W) or (H, W, 3)
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    tensor = torch.from_numpy(pixels).permute(2, 0, 1)  # (H, W, C) -> (C, H, W)
    tensor = (tensor - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)

    scale = max(1, DISPLAY_SIDE // min(size))
    display = image.resize((size[1] * scale, size[0] * scale), Image.Resampling.NEAREST).convert("RGB")
    return PreparedImage(tensor=tensor[None], display=np.asarray(display, dtype=np.float32) / 255.0)


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
    predictions = [
        {"class": int(i), "name": str(class_names[i]), "probability": round(float(p), 6)}
        for p, i in zip(probs[0].tolist(), indices[0].tolist())
    ]
    best = predictions[0]
    fig = plot_attention(
        prepared.display, cls_maps, layers=maps.layers, heads=head_labels,
        rollout=None if heat is None else heat[0], rollout_label=label or "",
        title=f"{title}: {best['name']} ({best['probability']:.0%})", alpha=alpha,
    )
    return fig, predictions


def _output_names(images: Sequence[Path]) -> list[str]:
    # Two inputs called a/x.jpg and b/x.jpg must not overwrite each other's PNG.
    names, seen = [], {}
    for path in images:
        stem = path.stem
        seen[stem] = seen.get(stem, 0) + 1
        names.append(stem if seen[stem] == 1 else f"{stem}_{seen[stem]}")
    return names


def main(argv: Sequence[str]) -> None:
    """Run `vit attention` with the given arguments (without the command name)."""
    from vit.tasks.classify import load_classifier  # Lightning is slow to import: only when run

    args = parse_args(argv)
    classifier = load_classifier(args.ckpt, map_location=args.device)
    model = classifier.model
    depth, num_heads = len(model.blocks), model.blocks[0].attn.num_heads
    if args.layer is not None:
        bad = [i for i in args.layer if not -depth <= i < depth]
        if bad:
            raise ValueError(f"--layer {bad}: the model has {depth} layers (0..{depth - 1})")
    heads = _parse_heads(args.head, num_heads)
    target = _target_index(args.target_class, classifier.class_names)
    if args.native_size:
        model.dynamic_img_size = True  # position embeddings are resampled to each image's grid

    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for path, name in zip(args.images, _output_names(args.images)):
        prepared = load_image(
            path, in_chans=classifier.in_chans, size=None if args.native_size else classifier.img_size,
            patch_size=model.patch_size, mean=classifier.mean, std=classifier.std,
        )
        prepared.tensor = prepared.tensor.to(args.device)
        fig, predictions = explain_image(
            model, prepared, class_names=classifier.class_names, layers=args.layer, heads=heads,
            rollout=args.rollout, discard_ratio=args.discard_ratio, target=target, top_k=args.top_k,
            alpha=args.alpha, title=path.name,
        )
        png = args.out / f"{name}.png"
        fig.savefig(png, dpi=100)
        results.append({"image": str(path), "png": str(png), "top_k": predictions})
        ranked = ", ".join(f"{p['name']} {p['probability']:.1%}" for p in predictions)
        print(f"{path}: {ranked}  -> {png}")

    summary = args.out / "predictions.json"
    summary.write_text(json.dumps(results, indent=2))
    print(f"wrote {len(results)} figure(s) and {summary}")
