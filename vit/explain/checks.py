"""Checks that an attention map means something about the model, not just about the image.

* **Deletion and insertion** (Petsiuk et al., 2018, RISE; MoRF/LeRF as in Samek et al., 2017): remove the
  patches a map ranks highest (MoRF) or lowest (LeRF) one at a time, replacing them by the image's mean, or
  insert them into a mean image, and follow the target class's probability. Area under each curve, against
  the same curves for a random patch order. A faithful map drops the probability fast under MoRF deletion
  (low AUC), slowly under LeRF (high AUC), and brings it back fast under insertion (high AUC).
* **Cascading model randomisation** (Adebayo et al., 2018, "Sanity Checks for Saliency Maps"): re-initialise
  the head, then the blocks from the top down, and give the Spearman rank correlation of each map with the
  trained model's at each depth. A map that stays the same on a random model is not explaining the model.
* **The pointing game** (Zhang et al., 2016) on a known answer (`pointing_set`): one informative patch per
  image, its pattern the class, at a random place; noise elsewhere. A hit is a map whose top patch is it.

Maps are functions ``(model, images) -> (B, h, w)``; `MAPS` has the cls map, rollout and gradient rollout.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from vit.explain.maps import collect_attention, gradient_rollout, rollout_streaming
from vit.nn.vision import VisionTransformer

MapFn = Callable[[VisionTransformer, Tensor], Tensor]


def cls_map(model: VisionTransformer, images: Tensor) -> Tensor:
    """The last layer's cls-to-patch attention, heads averaged: (B, h, w)."""
    return collect_attention(model, images, layers=[-1]).cls_maps()[0].mean(dim=1)


def rollout(model: VisionTransformer, images: Tensor) -> Tensor:
    """Attention rollout with mean head fusion: (B, h, w)."""
    return rollout_streaming(model, images)[1]


def grad_rollout(model: VisionTransformer, images: Tensor) -> Tensor:
    """Gradient-weighted rollout toward the predicted class (vit-explain's rule): (B, h, w)."""
    return gradient_rollout(model, images)[1]


MAPS: dict[str, MapFn] = {"cls attention": cls_map, "rollout": rollout, "grad rollout": grad_rollout}


def _patch(model: VisionTransformer) -> tuple[int, int]:
    return model.patch_size if isinstance(model.patch_size, tuple) else (model.patch_size,) * 2


def _patch_pixels(model: VisionTransformer, mask: Tensor) -> Tensor:
    """(B, h, w) patch mask -> (B, 1, H, W) pixel mask."""
    ph, pw = _patch(model)
    return mask.repeat_interleave(ph, dim=1).repeat_interleave(pw, dim=2)[:, None]


def _grid(model: VisionTransformer, images: Tensor) -> tuple[int, int]:
    """The patch grid (h, w) of ``images``."""
    ph, pw = _patch(model)
    return images.shape[-2] // ph, images.shape[-1] // pw


@torch.no_grad()
def _probability(model: VisionTransformer, images: Tensor, target: Tensor, batch_size: int = 512) -> Tensor:
    probs = [model(chunk).float().softmax(-1) for chunk in images.split(batch_size)]
    return torch.cat(probs).gather(1, target[:, None])[:, 0]


def _curve(model: VisionTransformer, images: Tensor, target: Tensor, order: Tensor, insert: bool) -> Tensor:
    """Mean target probability as the patches of ``order`` (B, n), first first, are deleted or inserted."""
    B, n = order.shape
    h, w = _grid(model, images)
    fill = images.mean(dim=(2, 3), keepdim=True).expand_as(images)
    points = []
    for k in range(n + 1):
        chosen = torch.zeros(B, n, dtype=torch.bool)
        chosen.scatter_(1, order[:, :k], True)
        mask = _patch_pixels(model, chosen.view(B, h, w)).to(images.device)
        x = torch.where(mask, images, fill) if insert else torch.where(mask, fill, images)
        points.append(_probability(model, x, target).mean())
    return torch.stack(points)


@torch.no_grad()
def ranked_curves(model: VisionTransformer, images: Tensor, heat: Tensor, target: Tensor) -> dict[str, Tensor]:
    """The curves of the patch order that ``heat`` (B, h, w) gives: "MoRF deletion", "LeRF deletion" and
    "insertion" (most relevant first)."""
    model.eval()
    ranked = heat.flatten(1).float().cpu().argsort(dim=1, descending=True)  # most relevant first
    return {
        "MoRF deletion": _curve(model, images, target, ranked, insert=False),
        "LeRF deletion": _curve(model, images, target, ranked.flip(1), insert=False),
        "insertion": _curve(model, images, target, ranked, insert=True),
    }


@torch.no_grad()
def random_curves(model: VisionTransformer, images: Tensor, target: Tensor, *, random_orders: int = 3,
                  seed: int = 0) -> dict[str, Tensor]:
    """The baseline: "random deletion" and "random insertion", averaged over ``random_orders`` random orders.
    It does not depend on a map, so a table of several maps computes it once."""
    model.eval()
    h, w = _grid(model, images)
    generator = torch.Generator().manual_seed(seed)
    orders = [torch.rand(len(images), h * w, generator=generator).argsort(dim=1) for _ in range(random_orders)]
    return {
        "random deletion": torch.stack([_curve(model, images, target, o, insert=False) for o in orders]).mean(0),
        "random insertion": torch.stack([_curve(model, images, target, o, insert=True) for o in orders]).mean(0),
    }


@torch.no_grad()
def perturbation_curves(
    model: VisionTransformer, images: Tensor, heat: Tensor, target: Tensor | None = None, *,
    random_orders: int = 3, seed: int = 0,
) -> dict[str, Tensor]:
    """Mean target probability after each of 0..h*w patches is deleted (MoRF, LeRF) or inserted.

    ``heat`` (B, h, w) ranks the patches; ``target`` defaults to the predicted class. Deleted patches take
    the image's per-channel mean; insertion starts from that mean image. Returns curves of length h*w + 1
    for "MoRF deletion", "LeRF deletion", "insertion" and the same with a random order ("random deletion",
    "random insertion", averaged over ``random_orders`` orders).
    """
    if target is None:
        target = model.eval()(images).argmax(dim=-1)
    return {**ranked_curves(model, images, heat, target),
            **random_curves(model, images, target, random_orders=random_orders, seed=seed)}


def area_under(curve: Tensor) -> float:
    """Trapezoidal area under a curve sampled at equal steps over the fraction 0..1 of patches."""
    return float(torch.trapezoid(curve, dx=1.0 / (len(curve) - 1)))


def spearman(a: Tensor, b: Tensor) -> Tensor:
    """Rank correlation of each pair of rows of (B, n) tensors (ties broken by order): (B,)."""
    ranks = lambda x: x.float().argsort(dim=1).argsort(dim=1).float()
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(1, keepdim=True), rb - rb.mean(1, keepdim=True)
    return (ra * rb).sum(1) / (ra.norm(dim=1) * rb.norm(dim=1)).clamp_min(1e-12)


def _reinitialise(module: nn.Module, generator_seed: int) -> None:
    torch.manual_seed(generator_seed)
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.trunc_normal_(sub.weight, std=0.02)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif hasattr(sub, "reset_parameters") and sub is not module:
            sub.reset_parameters()


def cascading_randomisation(
    model: VisionTransformer, images: Tensor, maps: dict[str, MapFn] | None = None, *, seed: int = 0
) -> dict[str, list[float]]:
    """Mean Spearman correlation of each map with the trained model's, as layers are re-initialised.

    Step 0 randomises the head, step i > 0 also the top i blocks, so the last step is a model with every
    block random (the embeddings stay). Returns, per map, ``depth + 1`` correlations, and under ``"steps"``
    the names of what was random at each step.
    """
    maps = MAPS if maps is None else maps
    model = model.eval()
    reference = {name: fn(model, images).flatten(1) for name, fn in maps.items()}
    randomised = copy.deepcopy(model)
    steps: list[str] = []
    out: dict[str, list[float]] = {name: [] for name in maps}
    depth = len(randomised.blocks)
    for step in range(depth + 1):
        if step == 0:
            _reinitialise(randomised.head, seed)
            steps.append("head")
        else:
            _reinitialise(randomised.blocks[depth - step], seed + step)
            steps.append(f"head + blocks {depth - step}..{depth - 1}")
        for name, fn in maps.items():
            out[name].append(float(spearman(fn(randomised, images).flatten(1), reference[name]).mean()))
    return {**out, "steps": steps}


PATTERNS = 4  # horizontal stripes, vertical stripes, checkerboard, a filled square with an empty centre


def _pattern(index: int, size: int) -> Tensor:
    r, c = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    shapes = [(r % 2 == 0), (c % 2 == 0), ((r + c) % 2 == 0),
              ((r == 0) | (c == 0) | (r == size - 1) | (c == size - 1))]
    return shapes[index].float() * 2.0 - 1.0  # +1 / -1


def pointing_set(num: int, *, grid: int = 4, patch: int = 4, noise: float = 0.5, seed: int = 0
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """The pointing game's known answer: images (num, 1, grid*patch, grid*patch), labels, informative patch.

    Each image is Gaussian noise with one patch, at a random grid cell, replaced by one of `PATTERNS`
    patterns (the class) plus noise. Returns images, labels (num,) and the informative cell index (num,).
    """
    g = torch.Generator().manual_seed(seed)
    size = grid * patch
    images = noise * torch.randn(num, 1, size, size, generator=g)
    labels = torch.randint(PATTERNS, (num,), generator=g)
    cells = torch.randint(grid * grid, (num,), generator=g)
    for i in range(num):
        r, c = divmod(int(cells[i]), grid)
        block = _pattern(int(labels[i]), patch) + noise * torch.randn(patch, patch, generator=g)
        images[i, 0, r * patch:(r + 1) * patch, c * patch:(c + 1) * patch] = block
    return images, labels, cells


def pointing_game(heat: Tensor, cells: Tensor) -> float:
    """Share of maps (B, h, w) whose top patch is the informative cell (B,)."""
    return float(heat.flatten(1).argmax(dim=1).eq(cells.to(heat.device)).float().mean())


def faithfulness_table(model: VisionTransformer, images: Tensor, maps: Sequence[str] = tuple(MAPS)) -> dict:
    """Deletion/insertion AUCs per map and the random baseline's, for `vit attention --faithfulness`."""
    target = model.eval()(images).argmax(dim=-1).detach()
    baseline = {key: area_under(value) for key, value in random_curves(model, images, target).items()}
    table: dict[str, dict[str, float]] = {}
    for name in maps:
        curves = ranked_curves(model, images, MAPS[name](model, images), target)
        table[name] = {**{key: area_under(value) for key, value in curves.items()}, **baseline}
    return table


__all__ = [
    "MAPS", "PATTERNS", "area_under", "cascading_randomisation", "cls_map", "faithfulness_table",
    "grad_rollout", "perturbation_curves", "pointing_game", "pointing_set", "random_curves", "ranked_curves",
    "rollout", "spearman",
]
