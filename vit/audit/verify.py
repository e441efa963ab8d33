"""Is a candidate pair an edited copy? The best colour correlation of the two pictures over the edits a copy
goes through.

    thumb = thumbnail(img)                       # (3, 32, 32) uint8: the whole image squeezed to a square
    scores = copy_scores(thumbs, i, j)           # (P,) in [-1, 1]: best NCC of pair (i[p], j[p]) over the grid
    copies = scores >= COPY_SCORE

A near copy is a picture resized, cropped by a few pixels, brightened and re-encoded. Squeezed to a square,
the resize disappears and the crop becomes, on each axis, a zoom into a window ``[offset, offset + extent]`` of
the other image (extent 0.82..1, anywhere inside). Brightness disappears in the normalised cross-correlation
(NCC, of the three colour channels together), and a light blur takes the JPEG noise. So the score of a pair is
the NCC of one image with the other resampled at the best window, either image as the crop.

The window grid (10 windows an axis) is searched on the luminance at 16 px, every row window with every column
window (resampling is separable: two matrix products), and the best is refined at 32 px, in colour, one axis
after the other, in moves of 0.03 and then 0.015 of the axis. Look-alikes (two stars, two cats, two digits 1)
share a silhouette but not their colours or pixels: under the best window they correlate below a copy.
``COPY_SCORE`` and the grid are calibrated on real folders with planted edits (docs/audit.md); a grayscale NCC
let same-shaped objects of other colours pass.
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from scipy.ndimage import gaussian_filter

from vit.data.io import to_rgb

THUMB = 32  # side of the stored colour thumbnail (3 KB an image)
COARSE = 16  # side the window grid is searched at
EXTENTS = (1.0, 0.94, 0.88, 0.82)  # share of an axis a crop keeps (crop + resize of the issue), coarse grid
PLACES = (0.0, 0.5, 1.0)  # where the window sits, as a share of the room left (1 - extent), coarse grid
STEPS = (0.03, 0.015)  # the refinement's moves of a window's offset and extent, one step after the other
COPY_SCORE = 0.975  # best NCC at or above which a candidate is a copy (docs/audit.md)
PREFILTER = 0.9  # coarse luminance NCC below which a pair is not refined: no copy scored under 0.95 there
BATCH = 128  # pairs per vectorised step: bounds the memory of the (pairs, windows, side, side) stacks
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def thumbnail(img: Image.Image) -> np.ndarray:
    """The image as (3, THUMB, THUMB) uint8 RGB, squeezed to a square (the aspect ratio goes: a crop of a few
    pixels changes it, and the verification models that as a window on each axis)."""
    rgb = to_rgb(img).resize((THUMB, THUMB), Image.Resampling.BILINEAR, reducing_gap=3.0)
    return np.ascontiguousarray(np.asarray(rgb).transpose(2, 0, 1))


def windows() -> list[tuple[float, float]]:
    """Every (offset, extent) of the grid on one axis, in [0, 1] units: the whole axis first."""
    return [(0.0, 1.0)] + [(place * (1 - e), e) for e in EXTENTS[1:] for place in PLACES]


def resampler(offset: np.ndarray | float, extent: np.ndarray | float, side: int) -> np.ndarray:
    """(..., side, side) linear-interpolation matrices: row u samples the source axis at the centre of output
    pixel u of the window ``[offset, offset + extent]`` (one matrix per element of the broadcast arguments)."""
    offset, extent = np.broadcast_arrays(np.asarray(offset, np.float64), np.asarray(extent, np.float64))
    centres = (offset[..., None] + extent[..., None] * (np.arange(side) + 0.5) / side) * side - 0.5
    centres = np.clip(centres, 0, side - 1)  # (..., side)
    low = np.floor(centres).astype(np.int64)
    weight = (centres - low).astype(np.float32)
    m = np.zeros((*centres.shape, side), dtype=np.float32)
    np.put_along_axis(m, low[..., None], (1 - weight)[..., None], axis=-1)
    high = np.minimum(low + 1, side - 1)[..., None]  # at the last pixel low == high: add, not overwrite
    np.put_along_axis(m, high, np.take_along_axis(m, high, axis=-1) + weight[..., None], axis=-1)
    return m


def _blurred(thumbs: np.ndarray) -> np.ndarray:
    """(N, 3, THUMB, THUMB) float32, blurred a little: JPEG noise and the grid's sub-pixel misalignment."""
    return gaussian_filter(thumbs.astype(np.float32), sigma=(0, 0, 0.6, 0.6))


def _luma(colour: np.ndarray, side: int) -> np.ndarray:
    """(N, side, side) float32 luminance of (N, 3, s, s) images, reduced to ``side`` by averaging blocks."""
    gray = np.tensordot(colour, LUMA, axes=([1], [0]))  # (N, s, s)
    k = gray.shape[-1] // side
    return gray.reshape(len(gray), side, k, side, k).mean(axis=(2, 4))


def _standardise(x: np.ndarray, axes: tuple[int, ...] = (-2, -1)) -> np.ndarray:
    """Zero mean over the last two axes, unit norm over ``axes`` (flat images stay zero: they match nothing)."""
    x = x - x.mean(axis=(-2, -1), keepdims=True)
    norm = np.sqrt((x * x).sum(axis=axes, keepdims=True))
    return x / np.where(norm > 1e-3, norm, np.inf)


def _correlate(target: np.ndarray, warped: np.ndarray, dims: int = 2) -> np.ndarray:
    """NCC of each ``target`` (P, *I) with every ``warped`` (P, *K, *I), I the last ``dims`` axes: the target
    standardised by `_standardise`, so sum(t * w) / |w - mean w| is the NCC, in three passes over ``warped``."""
    p, size = len(target), int(np.prod(target.shape[1:]))
    w = warped.reshape(p, -1, size)  # (P, K, n)
    t = target.reshape(p, size, 1)
    dot = (w @ t)[..., 0]  # (P, K)
    if dims == 2:
        centred = np.einsum("pkn,pkn->pk", w, w) - w.sum(axis=-1) ** 2 / size
    else:  # colour: each channel's own mean comes off
        ch = w.reshape(p, w.shape[1], 3, -1)
        centred = np.einsum("pkcn,pkcn->pk", ch, ch) - (ch.sum(axis=-1) ** 2).sum(axis=-1) / ch.shape[-1]
    norm = np.sqrt(np.maximum(centred, 0))
    return (dot / np.where(norm > 1e-3, norm, np.inf)).reshape(warped.shape[:-dims])


def _warp(images: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """rows @ image @ cols^T for every row and column resampler: images (P, s, s), rows (P | 1, R, s, s), cols
    (P | 1, C, s, s) -> (P, R, C, s, s)."""
    tall = rows @ images[:, None]  # (P, R, s, s)
    p, r, s, _ = tall.shape
    if cols.shape[0] == 1:  # the same column resamplers for every pair: one large matrix product, not P * R small
        c = cols.shape[1]
        wide = tall.reshape(p * r * s, s) @ cols[0].transpose(0, 2, 1).transpose(1, 0, 2).reshape(s, c * s)
        return wide.reshape(p, r, s, c, s).transpose(0, 1, 3, 2, 4)
    return tall[:, :, None] @ cols.transpose(0, 1, 3, 2)[:, None]


def _moves(window: np.ndarray, step: float) -> np.ndarray:
    """(P, 9, 2): each (offset, extent) of ``window`` (P, 2) and its 8 moves by ``step``, kept inside the axis."""
    d = np.array([(do, de) for de in (step, 0.0, -step) for do in (-step, 0.0, step)])
    moved = window[:, None] + d  # (P, 9, 2)
    extent = np.clip(moved[..., 1], 0.5, 1.0)
    return np.stack([np.clip(moved[..., 0], 0.0, 1.0 - extent), extent], axis=-1)


def _refine(whole: np.ndarray, crop: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Best colour NCC of ``whole`` (P, 3, s, s) with ``crop`` resampled at windows around ``rows`` and ``cols``
    (P, 2) (offset, extent): for each of `STEPS`, the row window's 9 moves, then the column window's."""
    side = whole.shape[-1]
    target = _standardise(whole, (-3, -2, -1))  # (P, 3, s, s)
    p = np.arange(len(whole))
    best = np.full(len(whole), -np.inf)

    def score(r: np.ndarray, c: np.ndarray) -> np.ndarray:  # windows (P, R, 2), (P, C, 2) -> (P, R, C)
        rm, cm = resampler(r[..., 0], r[..., 1], side), resampler(c[..., 0], c[..., 1], side)
        warped = np.stack([_warp(crop[:, ch], rm, cm) for ch in range(3)], axis=3)  # (P, R, C, 3, s, s)
        return _correlate(target, warped, dims=3)

    for step in STEPS:
        options = _moves(rows, step)
        found = score(options, cols[:, None])[:, :, 0]  # (P, 9)
        rows = options[p, found.argmax(axis=1)]
        options = _moves(cols, step)
        found = score(rows[:, None], options)[:, 0, :]
        cols = options[p, found.argmax(axis=1)]
        best = np.maximum(best, found.max(axis=1))
    return best


def copy_scores(thumbs: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """(P,) the best colour NCC of each pair (thumbs[i[p]], thumbs[j[p]]) over the window grid, either image
    as the crop of the other; 1.0 for identical thumbnails. ``thumbs``: (N, 3, THUMB, THUMB) from `thumbnail`."""
    i, j = np.asarray(i, dtype=np.int64), np.asarray(j, dtype=np.int64)
    scores = np.empty(len(i))
    if len(i) == 0:
        return scores
    used, inverse = np.unique(np.concatenate([i, j]), return_inverse=True)  # prepare only images in a pair
    pi, pj = inverse[:len(i)], inverse[len(i):]
    fine = _blurred(np.asarray(thumbs[used]))  # only these: a caller may hand in a lazy table
    coarse = _luma(fine, COARSE)
    grid = np.array(windows())  # (W, 2)
    coarse_grid = resampler(grid[:, 0], grid[:, 1], COARSE)[None]  # (1, W, s, s)
    for start in range(0, len(i), BATCH):
        a, b = pi[start:start + BATCH], pj[start:start + BATCH]
        best = np.full(len(a), -np.inf)
        for whole, crop in ((a, b), (b, a)):  # either image may be the cropped one
            found = _correlate(_standardise(coarse[whole]), _warp(coarse[crop], coarse_grid, coarse_grid))
            top = found.reshape(len(a), -1).argmax(axis=1)
            r, c = np.unravel_index(top, found.shape[1:])  # (P,) each
            rough = found.reshape(len(a), -1)[np.arange(len(a)), top]
            # Only pairs close at the coarse size are refined (the costly step); the others keep their coarse
            # score, well below a copy's (copies score 0.99 here, look-alikes that get this far 0.9 to 0.98).
            close = rough >= PREFILTER
            refined = rough.copy()
            if close.any():
                refined[close] = _refine(fine[whole[close]], fine[crop[close]], grid[r[close]], grid[c[close]])
            best = np.maximum(best, refined)
        scores[start:start + BATCH] = best
    return np.clip(scores, -1.0, 1.0)


def plain_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Grayscale NCC of two thumbnails at 32 x 32, no alignment: the issue's yardstick for 'plainly different
    pictures' (below 0.9)."""
    x, y = (_standardise(np.tensordot(t.astype(np.float32), LUMA, axes=([0], [0]))) for t in (a, b))
    return float((x * y).sum())
