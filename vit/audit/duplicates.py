"""Exact and near-duplicate images: a hash of the decoded pixels; perceptual hashes for candidates, verified.

    content_hash(img)            the same pixels (saved twice, under two names, in two formats) -> the same hash
    phash(img)                   64 bits from the low frequencies of the 32x32 grayscale image's DCT
    window_phashes(img)          the pHashes of 27 zoomed windows of the image (what a crop of it may show)
    near_pairs(hashes, radius)   every pair within ``radius`` differing bits, through a multi-index hash table
    find_duplicates(...)         exact pairs, and the near candidates that `vit.audit.verify` confirms

pHash (Zauner 2010; as ``imagehash.phash`` computes it): resize to 32x32 grayscale, 2-D DCT, keep the 8x8
lowest frequencies, one bit per coefficient: above their median or not. A resized, re-encoded (JPEG q 70),
slightly cropped or brightness-shifted copy keeps most bits, but not all: a crop of 4 pixels of a 54-pixel
image moves 10 to 24 of them, as far as the distance between unrelated look-alikes (issue 26). So the hash
only proposes candidates: a pair is a candidate when one image's pHash, or the pHash of one of its zoomed
windows (the crops a copy of it may be), lies within ``DEFAULT_RADIUS`` bits of the other's pHash; and
`vit.audit.verify` then decides, on the pixels, whether it is a copy (docs/audit.md has the calibration).

The search is multi-index hashing (Norouzi et al., 2012): split the 64 bits into 4 chunks of 16. Two hashes
within r bits agree within r // 4 bits on at least one chunk (pigeonhole), so each chunk's table is probed
with every variant of the chunk within r // 4 flipped bits, and only those candidates are compared in full.
Each probe is one vectorised table lookup, so 100,000 images take seconds, not 5e9 comparisons.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from itertools import combinations, product

import numpy as np
from PIL import Image
from scipy.fft import dctn

from vit.audit.verify import COPY_SCORE, copy_scores
from vit.data.io import to_rgb

DEFAULT_RADIUS = 10  # differing pHash bits, of 64, that still make a candidate (docs/audit.md)
CHUNKS, CHUNK_BITS = 4, 16
WINDOW_EXTENTS = (0.95, 0.89, 0.83)  # zooms of `window_phashes`: what a 0.85-0.95x resize and a 1-4 px crop leave


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


def popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(x).astype(np.int64)
    table = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)
    return table[x.view(np.uint8).reshape(-1, 8)].sum(axis=1)


def _masks(bits: int, flips: int) -> np.ndarray:
    """Every ``bits``-wide mask with at most ``flips`` bits set."""
    masks = [0]
    for k in range(1, flips + 1):
        masks += [sum(1 << b for b in chosen) for chosen in combinations(range(bits), k)]
    return np.array(masks, dtype=np.int64)


def near_pairs(hashes: np.ndarray, radius: int = DEFAULT_RADIUS, queries: np.ndarray | None = None,
               owners: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, distance) of every pair i < j of images within ``radius`` bits, sorted by (i, j).

    ``hashes`` (n,) are the images' 64-bit hashes. ``queries`` (m,), with ``owners`` (m,) the image each belongs
    to, are searched against them (default: the hashes themselves); a pair's distance is the smallest of its
    queries'. Multi-index hashing: for each of 4 16-bit chunks, a table of where each chunk value's images lie
    (a counting sort); every query variant within ``radius // 4`` flipped bits is looked up in it at once, and
    the candidates it yields are checked on all 64 bits."""
    hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
    if queries is None:
        queries, owners = hashes, np.arange(len(hashes))
    queries = np.ascontiguousarray(queries, dtype=np.uint64)
    owners = np.asarray(owners, dtype=np.int64)
    n = len(hashes)
    found_key, found_d = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for c in range(CHUNKS):
        shift, low16 = np.uint64(c * CHUNK_BITS), np.uint64(0xFFFF)
        chunk = ((hashes >> shift) & low16).astype(np.int64)
        order = np.argsort(chunk, kind="stable")
        counts_of = np.bincount(chunk, minlength=1 << CHUNK_BITS)
        starts_of = np.cumsum(counts_of) - counts_of
        asked = ((queries >> shift) & low16).astype(np.int64)
        for mask in _masks(CHUNK_BITS, radius // CHUNKS):
            wanted = asked ^ mask
            lo, counts = starts_of[wanted], counts_of[wanted]
            total = int(counts.sum())
            if total == 0:
                continue
            # Every (query q, candidate order[lo[q] + k]) for k < counts[q], flattened: position p of the
            # output belongs to query q and has offset p - (start of q's run) within it.
            q = np.repeat(np.arange(len(queries)), counts)
            run_start = np.cumsum(counts) - counts
            candidates = order[np.repeat(lo - run_start, counts) + np.arange(total)]
            keep = owners[q] != candidates
            q, candidates = q[keep], candidates[keep]
            distance = popcount(queries[q] ^ hashes[candidates])
            close = distance <= radius
            a, b = owners[q[close]], candidates[close]
            found_key.append(np.minimum(a, b) * n + np.maximum(a, b))
            found_d.append(distance[close])
    keys, distances = np.concatenate(found_key), np.concatenate(found_d)
    order = np.lexsort((distances, keys))  # a pair is found by several chunks and queries: keep its closest
    keys, distances = keys[order], distances[order]
    first = np.r_[True, keys[1:] != keys[:-1]] if len(keys) else np.empty(0, bool)
    keys, distances = keys[first], distances[first]
    return keys // n, keys % n, distances


def exact_groups(contents: list[str]) -> list[list[int]]:
    """Indices of items with equal content hashes, one list per hash shared by two or more items."""
    groups: dict[str, list[int]] = {}
    for index, content in enumerate(contents):
        groups.setdefault(content, []).append(index)
    return [members for members in groups.values() if len(members) > 1]


def find_duplicates(
    contents: Sequence[str], hashes: Sequence[int], windows: Sequence[Sequence[int]], thumbs: np.ndarray,
    radius: int = DEFAULT_RADIUS, min_score: float = COPY_SCORE,
) -> tuple[list[tuple[int, int, str, int, float]], int]:
    """(i, j, "exact" | "near", distance in pHash bits, verification score) for every duplicate pair i < j, and
    how many near candidates were checked.

    Exact: the same content hash (distance 0, score 1). Near: a candidate of the hash search (one image's pHash,
    or the pHash of one of its `window_phashes`, within ``radius`` bits of the other's pHash) whose
    `vit.audit.verify.copy_scores` reaches ``min_score``. Pairs already exact are not listed again."""
    pairs = [(a, b, "exact", 0, 1.0) for group in exact_groups(list(contents)) for a, b in combinations(group, 2)]
    exact = {(a, b) for a, b, *_ in pairs}
    n = len(hashes)
    whole = np.array(hashes, dtype=np.uint64)
    zoomed = np.array(windows, dtype=np.uint64).reshape(n, -1)
    queries = np.concatenate([whole, zoomed.reshape(-1)])
    owners = np.concatenate([np.arange(n), np.repeat(np.arange(n), zoomed.shape[1])])
    i, j, d = near_pairs(whole, radius, queries, owners)
    fresh = np.array([(int(a), int(b)) not in exact for a, b in zip(i, j)], dtype=bool)
    i, j, d = i[fresh], j[fresh], d[fresh]
    scores = copy_scores(thumbs, i, j)
    for a, b, distance, score in zip(i.tolist(), j.tolist(), d.tolist(), scores.tolist()):
        if score >= min_score:
            pairs.append((a, b, "near", distance, round(score, 4)))
    return pairs, len(i)
