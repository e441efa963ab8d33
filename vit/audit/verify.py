"""Is a candidate pair an edited copy? Its best colour correlation over the edits a copy goes through, against
the score an edited copy of its own images reaches, and against the pictures closest to either.

    thumb = thumbnail(img)                       # (3, 32, 32) uint8: the whole image squeezed to a square
    scores = copy_scores(thumbs, i, j)           # (P,) in [-1, 1]: best NCC of pair (i[p], j[p]) over the grid
    bars = own_bars(thumbs, edited_thumbs)       # (N,) each image's score against `edited` of itself
    copies = (scores >= MIN_SCORE) & (1 - scores <= needed_shortfall(bars[i], bars[j])) & closest(i, j, scores)

A near copy is a picture resized, cropped by a few pixels, brightened and re-encoded. Squeezed to a square,
the resize disappears and the crop becomes, on each axis, a zoom into a window ``[offset, offset + extent]`` of
the other image (extent 0.82..1, anywhere inside). Brightness disappears in the normalised cross-correlation
(NCC, of the three colour channels together), and a light blur takes some of the JPEG noise. So the score of
a pair is the NCC of one image with the other resampled at the best window, either image as the crop.

The window grid (10 windows an axis) is searched on the luminance at 16 px, every row window with every column
window (resampling is separable: two matrix products), and the best is refined at 32 px, in colour, one axis
after the other, in moves of 0.03 and then 0.015 of the axis.

What score a copy reaches depends on the picture: an upsampled digit keeps 0.998 through JPEG and a crop, a
textured 64-px photo 0.9, and two different digits of a class, aligned, correlate 0.99. No single threshold
serves both (issue 26). So each image carries its own bar, the score of its own `edited` copy, and a pair is a
copy when it falls short of 1 by at most ``TOLERANCE`` times its images' shortfall. Thin strokes (handwritten
1s) lose so much in the edit that a different 1 still passes its bar; but a 1 has dozens of such look-alikes
about as close, where a copy is closer to its original than anything else: `closest` keeps only pairs that
are each other's best (or an original and two copies of it). The constants are calibrated on real folders
with planted edits (docs/audit.md).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageEnhance
from scipy.ndimage import gaussian_filter

from vit.data.io import to_rgb

THUMB = 32  # side of the stored colour thumbnail (3 KB an image)
COARSE = 16  # side the window grid is searched at
EXTENTS = (1.0, 0.94, 0.88, 0.82)  # share of an axis a crop keeps (crop + resize of the issue), coarse grid
PLACES = (0.0, 0.5, 1.0)  # where the window sits, as a share of the room left (1 - extent), coarse grid
STEPS = (0.03, 0.015)  # the refinement's moves of a window's offset and extent, one step after the other
MIN_SCORE = 0.85  # no pair scoring below this is a copy, whatever its images' own bars (docs/audit.md)
TOLERANCE = 2.0  # a copy's shortfall 1 - score is at most this many times its images' own (docs/audit.md)
SLACK = 0.002  # ... plus this: the NCC's noise floor on images so smooth that their own bar is 0.999
# The edit an image's own bar is measured with: resized 0.9x, cropped 5/3/2/5 % (left, top, right, bottom),
# darkened 8%, JPEG quality 65: the hard end of what a near copy goes through (issue 26's edits).
EDIT_RESIZE, EDIT_CROP, EDIT_BRIGHTNESS, EDIT_QUALITY = 0.9, (0.05, 0.03, 0.02, 0.05), 0.92, 65
EDIT_SIDE = 256  # larger images are edited at this size: at 32 px their JPEG noise is gone either way
PREFILTER = 0.9  # coarse luminance NCC below which a pair is not refined: no copy scored under 0.95 there
BATCH = 128  # pairs per vectorised step: bounds the memory of the (pairs, windows, side, side) stacks
BLUR = 0.3  # pixels of the Gaussian blur at 32 px before correlating (docs/audit.md)
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def thumbnail(img: Image.Image) -> np.ndarray:
    """The image as (3, THUMB, THUMB) uint8 RGB, squeezed to a square (the aspect ratio goes: a crop of a few
    pixels changes it, and the verification models that as a window on each axis)."""
    rgb = to_rgb(img).resize((THUMB, THUMB), Image.Resampling.BILINEAR, reducing_gap=3.0)
    return np.ascontiguousarray(np.asarray(rgb).transpose(2, 0, 1))


def edited(img: Image.Image) -> Image.Image:
    """``img`` through the fixed edit of ``EDIT_*``, as a near copy of it would be (decoded back from JPEG)."""
    rgb = to_rgb(img)
    if max(rgb.size) > EDIT_SIDE:
        rgb = rgb.copy()
        rgb.thumbnail((EDIT_SIDE, EDIT_SIDE), Image.Resampling.BILINEAR, reducing_gap=3.0)
    w, h = max(8, round(rgb.width * EDIT_RESIZE)), max(8, round(rgb.height * EDIT_RESIZE))
    small = rgb.resize((w, h), Image.Resampling.BICUBIC)
    left, top, right, bottom = EDIT_CROP
    small = small.crop((round(left * w), round(top * h), w - round(right * w), h - round(bottom * h)))
    buffer = io.BytesIO()
    ImageEnhance.Brightness(small).enhance(EDIT_BRIGHTNESS).save(buffer, format="JPEG", quality=EDIT_QUALITY)
    return Image.open(buffer)


def own_bars(thumbs: np.ndarray, edited_thumbs: np.ndarray) -> np.ndarray:
    """(N,) each image's own bar: the score its edited copy (`edited`) reaches against it (`copy_scores`).
    Smooth images (upsampled digits, plain backgrounds) keep 0.998 through the edit, textured photos at 64 px
    0.9 or less: a look-alike of a smooth image falls short of its bar, a copy of a textured one does not."""
    n = len(thumbs)
    both = np.concatenate([np.asarray(thumbs), np.asarray(edited_thumbs)])
    return copy_scores(both, np.arange(n), np.arange(n) + n)


def needed_shortfall(bar_a: np.ndarray, bar_b: np.ndarray) -> np.ndarray:
    """The largest shortfall 1 - score a copy of images with these own bars may have."""
    return TOLERANCE * np.maximum(1 - np.asarray(bar_a), 1 - np.asarray(bar_b)) + SLACK


def closest(i: np.ndarray, j: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Which pairs (i[p], j[p]) are each other's closest picture (no other pair of either scores higher), or lie
    in a triangle of pairs that are each among both their images' two closest: an original and two copies of it.
    Two different handwritten 1s correlate like a copy and its original; but a 1 has dozens of look-alikes about
    as close, where a copy is closer to its original than anything else. Ties are kept."""
    i, j = np.asarray(i), np.asarray(j)
    first, second = reciprocal(i, j, scores, 1), reciprocal(i, j, scores, 2)
    near: dict[int, set[int]] = {}
    for a, b in zip(i[second].tolist(), j[second].tolist()):
        near.setdefault(a, set()).add(b)
        near.setdefault(b, set()).add(a)
    kept = first.copy()
    for k in np.flatnonzero(second & ~first).tolist():  # the few second-closest pairs: in a triangle?
        kept[k] = bool(near[int(i[k])] & near[int(j[k])])
    return kept


def reciprocal(i: np.ndarray, j: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Which pairs (i[p], j[p]) are among the ``k`` best-scoring pairs of both their images (k-reciprocal
    nearest neighbours; ties are kept)."""
    i, j, scores = np.asarray(i, np.int64), np.asarray(j, np.int64), np.asarray(scores, np.float64)
    kth = kth_best(i, j, scores, k)
    return (scores >= kth[i]) & (scores >= kth[j])


def kth_best(i: np.ndarray, j: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Each image's ``k``-th best score among the pairs (i[p], j[p]) it is in (-inf with fewer pairs)."""
    i, j, scores = np.asarray(i, np.int64), np.asarray(j, np.int64), np.asarray(scores, np.float64)
    if len(i) == 0:
        return np.zeros(0)
    owner, value = np.concatenate([i, j]), np.concatenate([scores, scores])
    order = np.lexsort((-value, owner))  # each image's pairs, best first
    owner, value = owner[order], value[order]
    start = np.r_[0, np.flatnonzero(owner[1:] != owner[:-1]) + 1]
    rank = np.arange(len(owner)) - np.repeat(start, np.diff(np.r_[start, len(owner)]))
    kth = np.full(int(owner.max()) + 1, -np.inf)
    at = rank == k - 1
    kth[owner[at]] = value[at]
    return kth


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
    """(N, 3, THUMB, THUMB) float32, blurred a little: JPEG noise and the grid's sub-pixel misalignment (more
    blur, 0.6 px, made two thin strokes of different widths alike: handwritten 1s passed as copies)."""
    return gaussian_filter(thumbs.astype(np.float32), sigma=(0, 0, BLUR, BLUR))


def _luma(colour: np.ndarray, side: int) -> np.ndarray:
    """(N, side, side) float32 luminance of (N, 3, s, s) images, reduced to ``side`` by averaging blocks."""
    gray = np.tensordot(colour, LUMA, axes=([1], [0]))  # (N, s, s)
    k = gray.shape[-1] // side
    return gray.reshape(len(gray), side, k, side, k).mean(axis=(2, 4))


def luma_features(thumbs: np.ndarray, side: int = 8) -> np.ndarray:
    """(N, side * side) float32: each thumbnail's luminance, blurred as for the scores, averaged down to
    ``side`` x ``side``, zero mean and unit norm: the dot product of two is their plain NCC at that size."""
    gray = _luma(_blurred(np.asarray(thumbs)), side)
    return _standardise(gray).reshape(len(gray), side * side)


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
