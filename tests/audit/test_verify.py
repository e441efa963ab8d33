"""The verification of near-duplicate candidates, on real images: every planted edit is kept, look-alikes are not.

The fixture is small and real: scikit-image's coins (24 distinct look-alike objects on one background), tiles of
its photos, and scikit-learn's digits; each image's edited copies are drawn with the calibration script's own
edits (resize 0.85-0.95, 1-4 px crop per side, brightness +-5-10%, JPEG q60-90), so the test and the
calibration table (docs/audit.md) judge the same thing.
"""

from __future__ import annotations

import io
from itertools import combinations

import numpy as np
import pytest
import skimage.data
from PIL import Image

from tests import load_script
from vit.audit.duplicates import find_duplicates, luma_hashes
from vit.audit.verify import (
    MIN_SCORE,
    closest,
    copy_scores,
    edited,
    needed_shortfall,
    own_bars,
    plain_correlation,
    reciprocal,
    thumbnail,
)

folders = load_script("audit_folders")


def originals() -> list[Image.Image]:
    """24 coins on their plain background, 8 photo tiles, 8 digits of two classes: 40 distinct pictures."""
    coins = np.asarray(skimage.data.coins())
    found = [Image.fromarray(coins[y + 10:y + 75, x:x + 64]) for y in (0, 75, 150, 225) for x in range(0, 321, 64)]
    for name in ("astronaut", "coffee"):
        pixels = getattr(skimage.data, name)()
        found += [Image.fromarray(pixels[y:y + 64, x:x + 64]) for y in (128, 256) for x in (128, 256)]
    digits = [item for item in folders.digits() if item[1] in ("1", "7")]
    return found + [img for img, _, _ in digits[:8]]


@pytest.fixture(scope="module")
def fixture() -> tuple[list[Image.Image], list[Image.Image]]:
    """The originals, and one edited copy of each."""
    rng = np.random.default_rng(0)
    pictures = originals()
    copies = [Image.open(io.BytesIO(folders.edited_copy(img, rng)[0])) for img in pictures]
    return pictures, copies


def judged(pictures: list[Image.Image], pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's score, and whether it scores like a copy: at least MIN_SCORE and within its images' own
    bars (the edited copy of each picture against it)."""
    thumbs = np.stack([thumbnail(img) for img in pictures])
    bars = own_bars(thumbs, np.stack([thumbnail(edited(img)) for img in pictures]))
    a, b = np.array(pairs).T
    scores = copy_scores(thumbs, a, b)
    return scores, (scores >= MIN_SCORE) & (1 - scores <= needed_shortfall(bars[a], bars[b]))


def test_every_planted_edit_is_kept(fixture):
    pictures, copies = fixture
    n = len(pictures)
    scores, kept = judged(pictures + copies, [(k, k + n) for k in range(n)])
    # Objects on a plain background (coins) and digits: every copy. Textured photo tiles lose most to JPEG at
    # this size: at most one of the 8 may fall short, as in the calibration table (docs/audit.md).
    assert kept[:24].all() and kept[32:].all(), np.round(scores, 3)
    assert kept[24:32].sum() >= 7 and kept.mean() >= 0.95, np.round(scores[24:32], 3)
    backwards, _ = judged(copies + pictures, [(k, k + n) for k in range(n)])  # either image may come first
    np.testing.assert_allclose(backwards, scores, atol=1e-5)


def test_look_alikes_are_rejected(fixture):
    pictures, _ = fixture
    pairs = list(combinations(range(len(pictures)), 2))
    scores, passed = judged(pictures, pairs)
    # Own bars alone reject every pair of different coins or photo tiles, though the closest correlate well.
    assert not [pair for pair, ok in zip(pairs, passed) if ok and pair[1] < 32]
    assert np.sort(scores[[b < 32 for _, b in pairs]])[-5:].min() > 0.8
    # Two different digits 1 upsampled from 8x8 can pass their bars; then each has another as close, and only a
    # pair that is both images' closest would stay. Here none: no pair that correlates below 0.9 unaligned.
    a, b = np.array(pairs).T
    kept = passed & closest(a, b, scores)
    thumbs = [thumbnail(img) for img in pictures]
    assert all(plain_correlation(thumbs[x], thumbs[y]) >= 0.9 for x, y in np.array(pairs)[kept]), np.array(pairs)[kept]


def test_closest_keeps_the_pairs_both_images_rank_highest():
    # A copy (0, 1) beside a look-alike 2 of both: 2's pairs with them go. Its pair with 3 stays: each is the
    # other's closest (a lone pair of look-alikes is for the own bars to reject, not for this rule).
    i, j = np.array([0, 0, 1, 2]), np.array([1, 2, 2, 3])
    np.testing.assert_array_equal(closest(i, j, np.array([0.995, 0.97, 0.96, 0.98])), [True, False, False, True])
    # An original and two copies of it (0, 1, 2) are all kept, their look-alike 3 is not.
    i, j = np.array([0, 0, 1, 0, 1, 2]), np.array([1, 2, 2, 3, 3, 3])
    scores = np.array([0.995, 0.993, 0.991, 0.970, 0.960, 0.965])
    np.testing.assert_array_equal(closest(i, j, scores), [True, True, True, False, False, False])
    # In a hub of 12 look-alikes, each image keeps at most its two best: 66 pairs, at most 12 kept.
    i, j = np.array([(a, b) for a, b in combinations(range(12), 2)]).T
    kept = closest(i, j, np.random.default_rng(0).uniform(0.98, 0.99, len(i)))
    assert kept.sum() <= 12 and np.bincount(np.r_[i[kept], j[kept]], minlength=12).max() <= 2
    np.testing.assert_array_equal(reciprocal(i[:3], j[:3], np.array([0.9, 0.8, 0.7]), 1), [True, False, False])
    assert closest(np.array([0, 1]), np.array([2, 2]), np.array([0.9, 0.9])).all()  # ties keep both


def test_needed_shortfall_is_the_looser_images():
    # A copy of a smooth image (bar 0.99) and a textured one (bar 0.90) may fall short by the textured one's
    # measure: 2 x (1 - 0.90) + 0.002 = 0.202, not the smooth one's 2 x 0.01 + 0.002 = 0.022. Both orders.
    np.testing.assert_allclose(needed_shortfall(np.array([0.99]), np.array([0.90])), [0.202])
    np.testing.assert_allclose(needed_shortfall(np.array([0.90]), np.array([0.99])), [0.202])
    np.testing.assert_allclose(needed_shortfall(np.array([0.999, 0.8]), np.array([0.999, 0.95])), [0.004, 0.402])


def test_own_bars_follow_the_picture(fixture):
    pictures, _ = fixture
    thumbs = np.stack([thumbnail(img) for img in pictures])
    bars = own_bars(thumbs, np.stack([thumbnail(edited(img)) for img in pictures]))
    # Upsampled digits are smooth and keep almost everything through the edit; textured photo tiles lose most.
    assert bars[32:].min() > 0.99 and np.median(bars[24:32]) < np.median(bars[32:])
    assert np.all(bars <= 1.0) and np.all(bars > 0.5)


def test_identical_thumbnails_score_one_and_flat_images_match_nothing():
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8))
    flat = Image.new("RGB", (40, 50), (120, 130, 140))
    thumbs = np.stack([thumbnail(img), thumbnail(img), thumbnail(flat), thumbnail(flat)])
    scores = copy_scores(thumbs, np.array([0, 2, 0]), np.array([1, 3, 2]))
    np.testing.assert_allclose(scores[0], 1.0, atol=1e-4)
    assert abs(scores[1]) < 1e-2 and abs(scores[2]) < 1e-2  # a flat image has no picture to compare
    assert plain_correlation(thumbnail(img), thumbnail(img)) == pytest.approx(1.0, abs=1e-5)


def test_find_duplicates_keeps_the_copies_and_drops_the_look_alikes(fixture):
    from vit.audit.duplicates import content_hash, phash, window_phashes

    pictures, copies = fixture
    images = pictures + copies + [pictures[0]]  # and an exact copy of the first coin
    thumbs = np.stack([thumbnail(i) for i in images])
    pairs, candidates = find_duplicates([content_hash(i) for i in images], [phash(i) for i in images],
                                        [window_phashes(i) for i in images], luma_hashes(thumbs), thumbs,
                                        np.stack([thumbnail(edited(i)) for i in images]))
    n = len(pictures)
    found = {(a, b): (kind, score) for a, b, kind, _, score, _ in pairs}
    assert found[(0, 2 * n)] == ("exact", 1.0)
    near = {(a, b) for (a, b), (kind, _) in found.items() if kind == "near"}
    expected = {(k, k + n) for k in range(n)} | {(k + n, 2 * n) for k in (0,)}  # the first coin's copy twice
    assert len(near & expected) >= 0.95 * len(expected)  # the hash step's recall, here on 41 pairs
    wrong = [(a, b) for a, b in near - expected if b < 32 or plain_correlation(thumbs[a], thumbs[b]) < 0.9]
    assert not wrong  # every candidate that is no copy was rejected, but for digits that are all but the same
    assert all(score >= needed for *_, score, needed in pairs)
    assert candidates >= len(near)
