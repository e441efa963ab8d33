"""Exact and near-duplicate images: a hash of the decoded pixels; perceptual hashes for candidates, verified.

    content_hash(img)            the same pixels (saved twice, under two names, in two formats) -> the same hash
    phash(img)                   64 bits from the low frequencies of the 32x32 grayscale image's DCT
    window_phashes(img)          the pHashes of 27 zoomed windows of the image (what a crop of it may show)
    luma_hashes(thumbs)          64 bits a thumbnail: the signs of random projections of its 8x8 luminance
    near_pairs(hashes, radius)   every pair within ``radius`` differing bits, through a multi-index hash table
    find_duplicates(...)         exact pairs, and the near candidates that `vit.audit.verify` confirms

pHash (Zauner 2010; as ``imagehash.phash`` computes it): resize to 32x32 grayscale, 2-D DCT, keep the 8x8
lowest frequencies, one bit per coefficient: above their median or not. A resized, re-encoded (JPEG q 70),
slightly cropped or brightness-shifted copy keeps most bits, but not all: a crop of 4 pixels of a 54-pixel
image moves 10 to 24 of them, as far as the distance between unrelated look-alikes (issue 26). So the hash
only proposes candidates: a pair is a candidate when one image's pHash, or the pHash of one of its zoomed
windows (the crops a copy of it may be), lies within ``DEFAULT_RADIUS`` bits of the other's pHash; and
`vit.audit.verify` then decides, on the pixels, whether it is a copy (docs/audit.md has the calibration).

pHash's bits compare each coefficient with the median of the 64. On a fine texture (a 48-px tile of foliage or
fabric) the low coefficients all sit near that median, so JPEG flips a dozen of them and no window comes within
the radius. A second hash proposes the rest: SimHash (Charikar, 2002) of the thumbnail's 8x8 luminance, one bit
per random direction, whose distance estimates the angle between the two patterns (a copy correlates 0.93-0.99
there: 1-7 bits of 64). Look-alike smooth images (digits, objects on plain backgrounds) have dozens of such
neighbours, so a luma pair is a candidate only when it is among the ``LUMA_NEIGHBOURS`` best-correlating luma
pairs of both its images.

The search is multi-index hashing (Norouzi et al., 2012): split the 64 bits into 4 chunks of 16. Two hashes
within r bits agree within r // 4 bits on at least one chunk (pigeonhole), so each chunk's table is probed
with every variant of the chunk within r // 4 flipped bits, and only those candidates are compared in full.
Each probe is one vectorised table lookup, so 100,000 images take seconds, not 5e9 comparisons.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from itertools import combinations, product
from typing import Any

import numpy as np
from PIL import Image
from scipy.fft import dctn

from vit.audit.verify import MIN_SCORE, closest, copy_scores, kth_best, luma_features, needed_shortfall, own_bars
from vit.data.io import to_rgb

DEFAULT_RADIUS = 10  # differing pHash bits, of 64, that still make a candidate (docs/audit.md)
CHUNKS, CHUNK_BITS = 4, 16
BLOCK_CANDIDATES = 16_000_000  # flattened candidates a step of the search holds at most, about (`_search_chunk`)
PARALLEL_QUERIES = 500_000  # searches with this many queries run their chunks in processes (`near_pairs`)
_SEARCH: Any = None  # (hashes, queries, owners, radius) of the search under way, inherited by forked workers
WINDOW_EXTENTS = (0.95, 0.89, 0.83)  # zooms of `window_phashes`: what a 0.85-0.95x resize and a 1-4 px crop leave
LUMA_RADIUS = 10  # differing `luma_hashes` bits that make a candidate: copies differ in 1-7 (docs/audit.md)
LUMA_NEIGHBOURS = 2  # of those, a pair must be among the best-correlating of both its images
# SimHash's random directions, fixed (a seed, float64): the same image gets the same hash on every machine.
_DIRECTIONS = np.random.default_rng(0).standard_normal((64, 64))


def content_hash(img: Image.Image) -> str:
    """A hash of the image's decoded pixels as 8-bit RGB (size included): equal for the same picture in any
    file format or name, and for a grayscale image and its RGB copy."""
    rgb = to_rgb(img)
    h = hashlib.blake2b(f"{rgb.size}".encode(), digest_size=16)
    h.update(rgb.tobytes())
    return h.hexdigest()


def phash(img: Image.Image) -> int:
    """The 64-bit perceptual hash (DCT) of an image, as an unsigned int."""
    gray = to_rgb(img).convert("L").resize((32, 32), Image.Resampling.LANCZOS)
    return _phash_of(np.asarray(gray, dtype=np.float64))


def _phash_of(gray: np.ndarray) -> int:
    return _phashes_of(gray[None])[0]


def _phashes_of(grays: np.ndarray) -> list[int]:
    """The pHash of each (32, 32) image of a stack, in one DCT call (27 calls cost 4x one call on 27 images)."""
    low = dctn(grays, type=2, axes=(1, 2))[:, :8, :8].reshape(len(grays), 64)  # the lowest frequencies
    bits = low > np.median(low, axis=1, keepdims=True)
    return [int(h) for h in np.packbits(bits, axis=1).view(">u8")[:, 0]]


def window_phashes(img: Image.Image) -> list[int]:
    """pHashes of the windows of ``img`` that an edited copy of it may show: zoomed in to ``WINDOW_EXTENTS`` of
    each axis, at the start, middle and end of the room left (a crop of a few pixels on each side, resized)."""
    gray = to_rgb(img).convert("L")
    gray = gray.resize((128, 128), Image.Resampling.BILINEAR, reducing_gap=3.0)  # one costly resize, not 18
    windows = []
    for extent in WINDOW_EXTENTS:
        room = 128 * (1 - extent)
        for top, left in product((0.0, room / 2, room), repeat=2):
            windows.append(np.asarray(gray.resize((32, 32), Image.Resampling.LANCZOS, box=(
                left, top, left + 128 * extent, top + 128 * extent)), dtype=np.float64))
    return _phashes_of(np.stack(windows))


def luma_hashes(thumbs: np.ndarray) -> list[int]:
    """The 64-bit SimHash of each (3, 32, 32) thumbnail (`vit.audit.verify.thumbnail`): bit k says on which side
    of the k-th fixed random direction its standardised 8x8 luminance lies (a flat image: every bit 0)."""
    bits = luma_features(thumbs).astype(np.float64) @ _DIRECTIONS > 0
    return [int(h) for h in np.packbits(bits, axis=1).view(">u8")[:, 0]]


def popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(x).astype(np.int64)
    table = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)
    return table[x.view(np.uint8).reshape(-1, 8)].sum(axis=1)


_bits = getattr(np, "bitwise_count", popcount)  # the hot loop's popcount: numpy >= 2.0's, without a copy


def _masks(bits: int, flips: int) -> np.ndarray:
    """Every ``bits``-wide mask with at most ``flips`` bits set."""
    masks = [0]
    for k in range(1, flips + 1):
        masks += [sum(1 << b for b in chosen) for chosen in combinations(range(bits), k)]
    return np.array(masks, dtype=np.int64)


def flips_per_chunk(radius: int) -> list[int]:
    """How many bits each chunk's probes flip so that no pair within ``radius`` is missed: the generalised
    pigeonhole (Qin et al., 2018). A pair differing in at least t_c + 1 bits of every chunk c differs in at least
    sum(t_c) + CHUNKS; so sum(t_c) = radius + 1 - CHUNKS is enough (radius 10: 2, 2, 2 and 1, not 2 on all 4)."""
    total = max(0, radius + 1 - CHUNKS)
    return [total // CHUNKS + (c < total % CHUNKS) for c in range(CHUNKS)]


def near_pairs(hashes: np.ndarray, radius: int = DEFAULT_RADIUS, queries: np.ndarray | None = None,
               owners: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, distance) of every pair i < j of images within ``radius`` bits, sorted by (i, j).

    ``hashes`` (n,) are the images' 64-bit hashes. ``queries`` (m,), with ``owners`` (m,) the image each belongs
    to, are searched against them (default: the hashes themselves); a pair's distance is the smallest of its
    queries'. Multi-index hashing: for each of 4 16-bit chunks, a table of where each chunk value's images lie
    (a counting sort); every query variant within `flips_per_chunk` flipped bits is looked up in it at once, and
    the candidates it yields are checked on all 64 bits. Large searches run the chunks in forked processes, one
    a core (the arrays are shared, copy-on-write; numpy's loops hold the GIL too often for threads to help)."""
    hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
    if queries is None:
        queries, owners = hashes, np.arange(len(hashes))
    queries = np.ascontiguousarray(queries, dtype=np.uint64)
    owners = np.asarray(owners, dtype=np.int64)
    n = len(hashes)
    global _SEARCH
    _SEARCH = (hashes, queries, owners, radius)
    workers = min(CHUNKS, len(os.sched_getaffinity(0)))
    try:
        if workers > 1 and len(queries) >= PARALLEL_QUERIES:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                found = list(pool.map(_search_chunk, range(CHUNKS), flips_per_chunk(radius)))
        else:
            found = [_search_chunk(c, flips) for c, flips in enumerate(flips_per_chunk(radius))]
    finally:
        _SEARCH = None
    keys = np.concatenate([np.empty(0, np.int64)] + [k for k, _ in found])
    distances = np.concatenate([np.empty(0, np.int64)] + [d for _, d in found])
    order = np.lexsort((distances, keys))  # a pair is found by several chunks and queries: keep its closest
    keys, distances = keys[order], distances[order]
    first = np.r_[True, keys[1:] != keys[:-1]] if len(keys) else np.empty(0, bool)
    keys, distances = keys[first], distances[first]
    return keys // n, keys % n, distances


def _search_chunk(c: int, flips: int) -> tuple[np.ndarray, np.ndarray]:
    """(pair keys i * n + j, distances) of the pairs of `near_pairs`'s search (`_SEARCH`) found through chunk
    ``c`` with ``flips`` flipped bits.

    The table holds the queries (28 an image), and the images' hashes probe it: the same pairs as the other way
    round, but each probe's lookups and bookkeeping run over n hashes, not 28 n queries (faster: docs/speed.md,
    "choices measured")."""
    hashes, queries, owners, radius = _SEARCH
    n = len(hashes)
    shift, low16 = np.uint64(c * CHUNK_BITS), np.uint64(0xFFFF)
    chunk = ((queries >> shift) & low16).astype(np.int32)
    order = np.argsort(chunk, kind="stable")
    table = queries[order]  # the queries in chunk order: a candidate's full hash is one gather away
    counts_of = np.bincount(chunk, minlength=1 << CHUNK_BITS).astype(np.int32)
    starts_of = np.cumsum(counts_of, dtype=np.int64) - counts_of
    probes = ((hashes >> shift) & low16).astype(np.int32)
    keys, distances = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    # A probe meets len(queries) / 65536 random queries a mask: blocks of probes bound the flattened candidates
    # (ImageNet's 1.28 M images make 36 M queries: 700 M candidates a mask for all probes at once).
    block = max(1, BLOCK_CANDIDATES * (1 << CHUNK_BITS) // max(1, len(queries)))
    for first in range(0, n, block):
        mine_probes, mine_hashes = probes[first:first + block], hashes[first:first + block]
        for mask in _masks(CHUNK_BITS, flips):
            wanted = mine_probes ^ np.int32(mask)
            counts = counts_of[wanted]
            ends = np.cumsum(counts, dtype=np.int64)
            total = int(ends[-1]) if len(ends) else 0
            if total == 0:
                continue
            # Every (image h, query at table position starts_of[wanted[h]] + k) for k < counts[h], flattened:
            # each image's run of positions, shifted from where its run lies in the output to where it lies in
            # the table. Most candidates are far: compare all 64 bits first, find their images only for the close.
            position = np.repeat(starts_of[wanted] - (ends - counts), counts) + np.arange(total)
            close = np.flatnonzero(_bits(np.repeat(mine_hashes, counts) ^ table[position]) <= radius)
            h = first + np.searchsorted(ends, close, side="right")  # the image each close candidate was probed by
            q = order[position[close]]
            a, b = owners[q], h
            other = a != b  # an image's own hash (and its windows against it) is no pair
            a, b, q = a[other], b[other], q[other]
            keys.append(np.minimum(a, b) * n + np.maximum(a, b))
            distances.append(popcount(queries[q] ^ hashes[b]))
    return np.concatenate(keys), np.concatenate(distances)


def exact_groups(contents: list[str]) -> list[list[int]]:
    """Indices of items with equal content hashes, one list per hash shared by two or more items."""
    groups: dict[str, list[int]] = {}
    for index, content in enumerate(contents):
        groups.setdefault(content, []).append(index)
    return [members for members in groups.values() if len(members) > 1]


def find_duplicates(
    contents: Sequence[str], hashes: Sequence[int], windows: Sequence[Sequence[int]], lumas: Sequence[int],
    thumbs: np.ndarray, edited: Any, radius: int = DEFAULT_RADIUS, min_score: float = MIN_SCORE,
) -> tuple[list[tuple[int, int, str, int, float, float]], int]:
    """(i, j, "exact" | "near", distance in pHash bits, verification score, score needed) for every duplicate
    pair i < j, and how many near candidates were checked.

    Exact: the same content hash (distance 0, score 1). Near: a candidate (`candidates`: one image's pHash, or
    the pHash of one of its `window_phashes`, within ``radius`` bits of the other's pHash; or their
    `luma_hashes` within ``LUMA_RADIUS`` bits, among the ``LUMA_NEIGHBOURS`` best-correlating of both images)
    that `vit.audit.verify` confirms: its `copy_scores` reaches ``min_score`` and the score its two images' own bars
    ask for (`needed_shortfall`), and the two are each other's closest candidates (`closest`). ``edited``
    gives the thumbnails of the images through `vit.audit.verify.edited`, indexed by an array of image indices
    (a lazy table: only the images of a pair that gets this far are edited). Pairs already exact are not listed
    again."""
    pairs = [(a, b, "exact", 0, 1.0, 1.0) for group in exact_groups(list(contents)) for a, b in combinations(group, 2)]
    exact = {(a, b) for a, b, *_ in pairs}
    n = len(hashes)
    i, j, d = candidates(hashes, windows, lumas, thumbs, radius)
    fresh = np.array([(int(a), int(b)) not in exact for a, b in zip(i, j)], dtype=bool)
    i, j, d = i[fresh], j[fresh], d[fresh]
    scores = copy_scores(thumbs, i, j)
    hopeful = np.flatnonzero((scores >= min_score) & closest(i, j, scores))
    used = np.unique(np.concatenate([i[hopeful], j[hopeful]]))
    bars = np.ones(n)
    if len(used):
        bars[used] = own_bars(thumbs[used], edited[used])
    needed = 1 - needed_shortfall(bars[i[hopeful]], bars[j[hopeful]])
    for k, need in zip(hopeful.tolist(), needed.tolist()):
        if scores[k] >= need:
            pairs.append((int(i[k]), int(j[k]), "near", int(d[k]), round(float(scores[k]), 4), round(need, 4)))
    return pairs, len(i)


def candidates(hashes: Sequence[int], windows: Sequence[Sequence[int]], lumas: Sequence[int], thumbs: np.ndarray,
               radius: int = DEFAULT_RADIUS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, pHash distance) of the near-duplicate candidates i < j, sorted by (i, j): the pHash search (an
    image's pHash or window pHashes within ``radius`` bits of the other's pHash), and the `luma_hashes` search
    (within ``LUMA_RADIUS`` bits, among the ``LUMA_NEIGHBOURS`` best-correlating luma pairs of both images: a
    look-alike digit has dozens; their distance is the two whole pHashes')."""
    n = len(hashes)
    whole = np.array(hashes, dtype=np.uint64)
    zoomed = np.array(windows, dtype=np.uint64).reshape(n, -1)
    queries = np.concatenate([whole, zoomed.reshape(-1)])
    owners = np.concatenate([np.arange(n), np.repeat(np.arange(n), zoomed.shape[1])])
    i, j, d = near_pairs(whole, radius, queries, owners)
    li, lj, _ = near_pairs(np.array(lumas, dtype=np.uint64), LUMA_RADIUS)
    if len(li):
        used, inverse = np.unique(np.concatenate([li, lj]), return_inverse=True)  # only these: a lazy table
        features = luma_features(thumbs[used])
        a, b = inverse[:len(li)], inverse[len(li):]
        correlation = (features[a] * features[b]).sum(axis=1)
        kth = kth_best(a, b, correlation, LUMA_NEIGHBOURS)
        best = (correlation >= kth[a]) & (correlation >= kth[b])
        li, lj = li[best], lj[best]
    keys = np.concatenate([i * n + j, li * n + lj])
    distances = np.concatenate([d, popcount(whole[li] ^ whole[lj])])
    keys, first = np.unique(keys, return_index=True)  # a pair both searches found keeps its pHash search distance
    return keys // n, keys % n, distances[first]
