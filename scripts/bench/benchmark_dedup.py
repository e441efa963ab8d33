"""Time `vit audit`'s near-duplicate search with its verification, on generated hashes and thumbnails.

    python scripts/bench/benchmark_dedup.py                      # 100,000 images, radius 10 (the default)
    python scripts/bench/benchmark_dedup.py --hashes 1000000 --radius 8

Each generated image has a random 64-bit pHash and 27 window hashes (its zoomed windows: each its pHash with
8 to 16 bits flipped, as they are on real images), and a random 64-bit luma hash. 2% of the images are planted
as copies of others: their pHash is one of the original's window hashes with 0 to ``radius`` bits flipped, their
luma hash the original's with 0 to ``LUMA_RADIUS`` bits flipped, and their thumbnail is the original's, zoomed
into a window, brightened and with noise added. The timed step is the whole of
`vit.audit.duplicates.find_duplicates`: the multi-index searches (28 pHash queries an image, and the luma
hashes), and the verification of every candidate. Then the neighbours of ``--check`` random queries are counted
by brute force against all the hashes and must be exactly the pairs the index found for them, and 95% of the
planted copies must be verified.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from vit.audit.duplicates import LUMA_RADIUS, find_duplicates, near_pairs, popcount
from vit.audit.verify import EDIT_CROP, resampler

WINDOWS = 27


def flip(values: np.ndarray, low: int, high: int, rng: np.random.Generator) -> np.ndarray:
    """Each value with ``low`` to ``high`` random bits flipped (a bit drawn twice flips once: at most ``high``)."""
    count = rng.integers(low, high + 1, values.shape)
    bits = rng.integers(0, 64, (*values.shape, max(high, 1)))
    used = np.arange(max(high, 1)) < count[..., None]
    masks = np.where(used, np.uint64(1) << bits.astype(np.uint64), np.uint64(0))
    return values ^ np.bitwise_or.reduce(masks, axis=-1)


def edit(base: np.ndarray, rng: np.random.Generator, window: tuple[float, float] | None = None) -> np.ndarray:
    """A thumbnail zoomed into a window (a crop: issue 26's 1-4 px of a 58-px image on each side, or the given
    (offset, extent)), brightened 5-10% and with noise (JPEG's), as a near copy is."""
    if window is None:
        left, right = rng.uniform(1 / 58, 4 / 58, 2)
        window = (left, 1 - left - right)
    r = resampler(window[0], window[1], 32)
    brightness = 1 + rng.choice([-1, 1]) * rng.uniform(0.05, 0.1)
    copy = np.einsum("ij,cjk,lk->cil", r, base, r) * brightness + rng.normal(0, 2, (3, 32, 32))
    return np.clip(copy, 0, 255)


def generated(n: int, radius: int, seed: int = 0):
    """(hashes (n,), windows (n, 27), luma hashes (n,), thumbnails of the planted pairs' images and their edited
    copies, planted (copy, original) pairs)."""
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    windows = flip(np.repeat(hashes[:, None], WINDOWS, axis=1), 8, 16, rng)  # (n, 27)
    copies = rng.choice(np.arange(n // 2, n), n // 50, replace=False)
    originals = rng.integers(0, n // 2, len(copies))
    hashes[copies] = flip(windows[originals, rng.integers(0, WINDOWS, len(copies))], 0, radius, rng)
    lumas = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    lumas[copies] = flip(lumas[originals], 0, LUMA_RADIUS, rng)
    drawn, edited = {}, {}
    for c, o in zip(copies.tolist(), originals.tolist()):
        base = drawn.setdefault(o, np.clip(rng.normal(128, 40, (3, 8, 8)).repeat(4, 1).repeat(4, 2), 0, 255))
        drawn[c] = edit(base, rng)
    left, _, right, _ = EDIT_CROP
    for k, picture in drawn.items():  # what `vit.audit.verify.edited` makes of each drawn image: its fixed crop
        edited[k] = edit(picture, rng, (left, 1 - left - right))
    return hashes, windows, lumas, drawn, edited, list(zip(copies.tolist(), originals.tolist()))


class Thumbnails:
    """The thumbnails `find_duplicates` asks for by index: the drawn ones, and noise for any other image."""

    def __init__(self, drawn: dict[int, np.ndarray], n: int) -> None:
        self.drawn, self.shape = drawn, (n, 3, 32, 32)

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(0)
        return np.stack([self.drawn.get(int(i), rng.integers(0, 256, (3, 32, 32))) for i in index]).astype(np.uint8)


def brute_force(hashes: np.ndarray, queries: np.ndarray, owners: np.ndarray, asked: np.ndarray,
                radius: int) -> set[tuple[int, int]]:
    """Every pair (i, j), i < j, found by one of the ``asked`` queries against all hashes, each compared in full."""
    found = set()
    for q in asked.tolist():
        for other in np.flatnonzero(popcount(hashes ^ queries[q]) <= radius).tolist():
            if other != owners[q]:
                found.add((min(owners[q], other), max(owners[q], other)))
    return found


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns (and prints) its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hashes", type=int, default=100_000, help="generated images (default: %(default)s)")
    parser.add_argument("--radius", type=int, default=10)
    parser.add_argument("--check", type=int, default=1_000, help="queries whose neighbours brute force recounts")
    args = parser.parse_args(argv)
    n = args.hashes
    hashes, windows, lumas, drawn, edited, planted = generated(n, args.radius)
    started = time.perf_counter()
    pairs, candidates = find_duplicates([str(k) for k in range(n)], hashes.tolist(), windows, lumas.tolist(),
                                        Thumbnails(drawn, n), Thumbnails(edited, n), args.radius)
    seconds = time.perf_counter() - started
    verified = {(a, b) for a, b, kind, *_ in pairs if kind == "near"}
    truth = {(min(c, o), max(c, o)) for c, o in planted}
    kept = len(truth & verified) / len(truth)
    assert kept >= 0.95, f"only {kept:.3f} of the planted copies were verified"

    queries = np.concatenate([hashes, windows.reshape(-1)])
    owners = np.concatenate([np.arange(n), np.repeat(np.arange(n), WINDOWS)])
    asked = np.random.default_rng(1).choice(len(queries), args.check, replace=False)
    i, j, _ = near_pairs(hashes, args.radius, queries[asked], owners[asked])
    expected = brute_force(hashes, queries, owners, asked, args.radius)
    assert set(zip(i.tolist(), j.tolist())) == expected, "index and brute force disagree"
    figures = {"images": n, "queries": len(queries), "radius": args.radius, "candidates": candidates,
               "verified": len(verified), "planted": len(truth), "planted_verified": round(kept, 3),
               "seconds": round(seconds, 2),
               "brute_force_check": f"the same {len(expected)} pairs for {args.check} random queries"}
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
