"""Time near-duplicate search on generated perceptual hashes: `vit audit`'s multi-index hashing.

    python scripts/benchmark_dedup.py                      # 100,000 hashes, radius 10 (the default)
    python scripts/benchmark_dedup.py --hashes 1000000 --radius 8

The hashes are random 64-bit values, 2% of them planted as near copies of others (1 to ``radius`` bits
flipped), so the search has pairs to find. After the timed search, the neighbours of ``--check`` random hashes
are counted by brute force against all the others, and must be exactly the pairs the index found for them.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from vit.audit.duplicates import near_pairs, popcount


def generated_hashes(n: int, radius: int, seed: int = 0) -> np.ndarray:
    """``n`` random 64-bit hashes, 2% of them near copies of earlier ones."""
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    copies = rng.choice(np.arange(n // 2, n), n // 50, replace=False)
    for i in copies:
        flips = rng.choice(64, int(rng.integers(1, radius + 1)), replace=False)
        hashes[i] = hashes[int(rng.integers(0, n // 2))] ^ np.uint64(sum(1 << int(b) for b in flips))
    return hashes


def brute_force(hashes: np.ndarray, queries: np.ndarray, radius: int) -> set[tuple[int, int]]:
    """Every pair (i, j), i < j, with i or j among ``queries``, within ``radius`` bits: each query against all."""
    found = set()
    for q in queries.tolist():
        for other in np.flatnonzero(popcount(hashes ^ hashes[q]) <= radius).tolist():
            if other != q:
                found.add((min(q, other), max(q, other)))
    return found


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns (and prints) its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hashes", type=int, default=100_000)
    parser.add_argument("--radius", type=int, default=10)
    parser.add_argument("--check", type=int, default=1_000, help="hashes whose neighbours brute force recounts")
    args = parser.parse_args(argv)
    hashes = generated_hashes(args.hashes, args.radius)
    started = time.perf_counter()
    i, j, _ = near_pairs(hashes, args.radius)
    seconds = time.perf_counter() - started
    queries = np.random.default_rng(1).choice(args.hashes, args.check, replace=False)
    asked = set(queries.tolist())
    from_index = {(a, b) for a, b in zip(i.tolist(), j.tolist()) if a in asked or b in asked}
    expected = brute_force(hashes, queries, args.radius)
    assert from_index == expected, f"index and brute force disagree on {len(from_index ^ expected)} pairs"
    figures = {"hashes": args.hashes, "radius": args.radius, "pairs": len(i), "seconds": round(seconds, 2),
               "brute_force_check": f"the same {len(expected)} pairs for {args.check} random hashes"}
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
