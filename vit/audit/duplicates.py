"""Exact and near-duplicate images: a hash of the decoded pixels, and a perceptual hash with a radius.

    content_hash(img)            the same pixels (saved twice, under two names, in two formats) -> the same hash
    phash(img)                   64 bits from the low frequencies of the 32x32 grayscale image's DCT
    near_pairs(hashes, radius)   every pair within ``radius`` differing bits, through a multi-index hash table

pHash (Zauner 2010; as ``imagehash.phash`` computes it): resize to 32x32 grayscale, 2-D DCT, keep the 8x8
lowest frequencies, one bit per coefficient: above their median or not. A resized, re-encoded (JPEG q 70),
slightly cropped or brightness-shifted copy keeps most bits: ``DEFAULT_RADIUS`` differing bits of 64 count
as a near-duplicate (see the README's `vit audit` section for what it found and missed on the digits).

The search is multi-index hashing (Norouzi et al., 2012): split the 64 bits into 4 chunks of 16. Two hashes
within r bits agree within r // 4 bits on at least one chunk (pigeonhole), so each chunk's table is probed
with every variant of the chunk within r // 4 flipped bits, and only those candidates are compared in full.
Each probe is one vectorised sorted-array lookup, so 100,000 hashes take seconds, not 5e9 comparisons.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from itertools import combinations

import numpy as np
from PIL import Image
from scipy.fft import dctn

from vit.data.io import to_rgb

DEFAULT_RADIUS = 10  # differing pHash bits, of 64, that still make a near-duplicate (see the README)
CHUNKS, CHUNK_BITS = 4, 16


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
    low = dctn(np.asarray(gray, dtype=np.float64), type=2)[:8, :8]  # (8, 8) lowest frequencies
    bits = (low > np.median(low)).reshape(-1)
    return int(np.packbits(bits).view(">u8")[0])


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


def near_pairs(hashes: np.ndarray, radius: int = DEFAULT_RADIUS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, distance) of every pair i < j of 64-bit ``hashes`` at most ``radius`` bits apart, sorted by (i, j).

    Multi-index hashing: for each of 4 16-bit chunks, the chunk values are sorted once; every variant within
    ``radius // 4`` flipped bits is looked up with one ``searchsorted``, and the candidates it yields are
    checked on all 64 bits."""
    hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
    n = len(hashes)
    found_i, found_j = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    flips = radius // CHUNKS
    for c in range(CHUNKS):
        chunk = ((hashes >> np.uint64(c * CHUNK_BITS)) & np.uint64(0xFFFF)).astype(np.int64)
        order = np.argsort(chunk, kind="stable")
        sorted_chunk = chunk[order]
        for mask in _masks(CHUNK_BITS, flips):
            wanted = chunk ^ mask
            lo = np.searchsorted(sorted_chunk, wanted, side="left")
            hi = np.searchsorted(sorted_chunk, wanted, side="right")
            counts = hi - lo
            total = int(counts.sum())
            if total == 0:
                continue
            # Every (query q, candidate order[lo[q] + k]) for k < counts[q], flattened: position p of the
            # output belongs to query q and has offset p - (start of q's run) within it.
            queries = np.repeat(np.arange(n), counts)
            run_start = np.cumsum(counts) - counts  # (n,) where each query's run begins in the output
            candidates = order[np.repeat(lo - run_start, counts) + np.arange(total)]
            keep = queries < candidates
            queries, candidates = queries[keep], candidates[keep]
            close = popcount(hashes[queries] ^ hashes[candidates]) <= radius
            found_i.append(queries[close])
            found_j.append(candidates[close])
    i, j = np.concatenate(found_i), np.concatenate(found_j)
    keys = np.unique(i * n + j)  # a pair close on several chunks is found several times
    i, j = keys // n, keys % n
    return i, j, popcount(hashes[i] ^ hashes[j])


def exact_groups(contents: list[str]) -> list[list[int]]:
    """Indices of items with equal content hashes, one list per hash shared by two or more items."""
    groups: dict[str, list[int]] = {}
    for index, content in enumerate(contents):
        groups.setdefault(content, []).append(index)
    return [members for members in groups.values() if len(members) > 1]


def find_duplicates(
    contents: Sequence[str], hashes: Sequence[int], radius: int = DEFAULT_RADIUS,
) -> list[tuple[int, int, str, int]]:
    """(i, j, "exact" | "near", distance in pHash bits) for every duplicate pair i < j: the same content hash
    (distance 0), or pHashes within ``radius`` bits (pairs already exact are not listed again)."""
    pairs = [(a, b, "exact", 0) for group in exact_groups(list(contents)) for a, b in combinations(group, 2)]
    exact = {(a, b) for a, b, _, _ in pairs}
    for a, b, d in zip(*near_pairs(np.array(hashes, dtype=np.uint64), radius)):
        if (int(a), int(b)) not in exact:
            pairs.append((int(a), int(b), "near", int(d)))
    return pairs
