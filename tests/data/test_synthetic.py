"""The seeded toy translation tasks."""

from __future__ import annotations

import pytest

from vit.data.synthetic import number_to_words, synthetic_pairs


def test_synthetic_tasks_are_right_and_reproducible():
    for task, check in [
        ("copy", lambda s: s),
        ("reverse", lambda s: s[::-1]),
        ("sort", lambda s: sorted(s, key=int)),
    ]:
        pairs = synthetic_pairs(task, 50, min_len=5, max_len=15, num_symbols=20, seed=1)
        assert pairs == synthetic_pairs(task, 50, min_len=5, max_len=15, num_symbols=20, seed=1)
        for source, target in pairs:
            tokens = source.split()
            assert 5 <= len(tokens) <= 15 and all(0 <= int(t) < 20 for t in tokens)
            assert target.split() == check(tokens)
    assert synthetic_pairs("copy", 5, seed=1) != synthetic_pairs("copy", 5, seed=2)
    for source, target in synthetic_pairs("numbers", 20, min_len=1, max_len=6):
        assert target == number_to_words(int(source.replace(" ", "")))
    with pytest.raises(ValueError, match="task must be one of"):
        synthetic_pairs("shuffle", 3)


@pytest.mark.parametrize(("n", "words"), [
    (0, "zero"),
    (7, "seven"),
    (13, "thirteen"),
    (40, "forty"),
    (307, "three hundred seven"),
    (1000, "one thousand"),
    (21_000_019, "twenty one million nineteen"),
    (999_999_999_999_999, "nine hundred ninety nine trillion nine hundred ninety nine billion nine hundred "
                          "ninety nine million nine hundred ninety nine thousand nine hundred ninety nine"),
])
def test_number_to_words(n, words):
    assert number_to_words(n) == words
