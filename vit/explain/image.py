"""One image explained, as `vit attention` draws it: the input prepared for a trained classifier, then a figure of
its layers x heads of cls-to-patch maps with the rollout, and its top classes.

    prepared = prepare_image(Image.open("cat.jpg"), classifier)           # as `vit predict` prepares it
    fig, top = explain_image(classifier.model, prepared, class_names=classifier.class_names, title="cat.jpg")

``native_size=True`` keeps the image's own size (rounded down to the patch size, at most `NATIVE_MAX_PATCHES`
patches) instead of the checkpoint's resize and centre crop; the model then needs ``dynamic_img_size``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image
from torch import Tensor
from torchvision.transforms import v2

from vit.deploy.classifier import Classifier
from vit.deploy.inference import top_k_entries
from vit.explain.maps import collect_attention, gradient_rollout, rollout_streaming
from vit.explain.plot import plot_attention, to_display_image
from vit.nn.vision import VisionTransformer

ROLLOUTS = ("mean", "max", "min", "grad", "none")
DISPLAY_SIDE = 224  # small inputs (8x8 digits) are drawn larger, with visible pixels
NATIVE_MAX_PATCHES = 4096  # native size: 64 x 64 patches (1024 x 1024 pixels at 16 px a patch)


@dataclass
class PreparedImage:
    """One input: the normalised tensor the model sees and the same pixels for display."""

    tensor: Tensor  # (1, C, H, W), normalised
    display: np.ndarray  # (H', W', 3) in [0, 1], the model's input scaled up for drawing


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
    layers: Sequence[int] | None = None,
    heads: list[int] | str | None = None,
    rollout: str = "mean",
    discard_ratio: float = 0.0,
    target: int | None = None,
    top_k: int = 5,
    alpha: float = 0.5,
    title: str = "",
) -> tuple[Figure, list[dict]]:
    """The figure for one image and its top-k predictions as dicts (class, name, probability).

    ``layers`` (None: all) and ``heads`` (indices, "mean" for their average, None: all) choose the maps drawn;
    ``rollout`` is one of `ROLLOUTS` ("grad": gradient-weighted towards ``target``, None: the predicted class)."""
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
    verdict = f"{predictions[0]['name']} ({predictions[0]['probability']:.0%})"
    fig = plot_attention(
        prepared.display, cls_maps, layers=maps.layers, heads=head_labels,
        rollout=None if heat is None else heat[0], rollout_label=label or "",
        title=f"{title}: {verdict}" if title else verdict, alpha=alpha,
    )
    return fig, predictions
