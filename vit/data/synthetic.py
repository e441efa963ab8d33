"""Seeded toy translation tasks (copy, reverse, sort, numbers to words) for checks and demos offline."""

from __future__ import annotations

import random

SYNTHETIC_TASKS = ("copy", "reverse", "sort", "numbers")

Pair = tuple[str, str]


_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
)
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = ("", "thousand", "million", "billion", "trillion")


def number_to_words(n: int) -> str:
    """English words for 0 <= n < 10**15, e.g. 307 -> 'three hundred seven'."""
    if not 0 <= n < 10**15:
        raise ValueError(f"number_to_words handles 0 <= n < 10**15, got {n}")
    if n == 0:
        return "zero"
    words: list[str] = []
    for scale in range(len(_SCALES) - 1, -1, -1):
        group = n // 1000**scale % 1000
        if not group:
            continue
        hundreds, rest = divmod(group, 100)
        if hundreds:
            words += [_ONES[hundreds], "hundred"]
        if rest >= 20:
            words.append(_TENS[rest // 10])
            if rest % 10:
                words.append(_ONES[rest % 10])
        elif rest:
            words.append(_ONES[rest])
        if _SCALES[scale]:
            words.append(_SCALES[scale])
    return " ".join(words)


def _synthetic_pair(task: str, rng: random.Random, min_len: int, max_len: int, num_symbols: int) -> Pair:
    length = rng.randint(min_len, max_len)
    if task == "numbers":
        digits = [rng.randint(1 if length > 1 else 0, 9)] + [rng.randint(0, 9) for _ in range(length - 1)]
        return " ".join(map(str, digits)), number_to_words(int("".join(map(str, digits))))
    seq = [rng.randrange(num_symbols) for _ in range(length)]
    target = {"copy": seq, "reverse": seq[::-1], "sort": sorted(seq)}[task]
    return " ".join(map(str, seq)), " ".join(map(str, target))


def synthetic_pairs(
    task: str,
    num_pairs: int,
    *,
    min_len: int = 5,
    max_len: int = 15,
    num_symbols: int = 20,
    seed: int = 0,
    exclude: set[str] | None = None,
) -> list[Pair]:
    """Seeded toy pairs. Sources are symbols ``0 .. num_symbols-1`` (digits for "numbers").

    copy: ``4 1 7 -> 4 1 7``; reverse: ``4 1 7 -> 7 1 4``; sort: ``4 1 7 -> 1 4 7``;
    numbers: ``3 0 7 -> three hundred seven``. Sources in ``exclude`` are never produced,
    which keeps held-out splits disjoint from training.
    """
    if task not in SYNTHETIC_TASKS:
        raise ValueError(f"task must be one of {SYNTHETIC_TASKS}, got {task!r}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    if task == "numbers" and max_len > 15:
        raise ValueError(f"the numbers task spells numbers below 10**15: need max_len <= 15, got {max_len}")
    if task != "numbers" and num_symbols < 2:
        raise ValueError(f"num_symbols must be >= 2, got {num_symbols}")
    rng = random.Random(f"{task}-{seed}")
    pairs: list[Pair] = []
    attempts = 0
    while len(pairs) < num_pairs:
        attempts += 1
        if attempts > 100 * num_pairs + 1000:
            raise ValueError(
                f"could not draw {num_pairs} {task!r} pairs outside the excluded sources; "
                "the space of sequences is too small: widen min_len/max_len or num_symbols"
            )
        pair = _synthetic_pair(task, rng, min_len, max_len, num_symbols)
        if exclude is None or pair[0] not in exclude:
            pairs.append(pair)
    return pairs


__all__ = ["SYNTHETIC_TASKS", "number_to_words", "synthetic_pairs"]
