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
from vit.audit.duplicates import find_duplicates
from vit.audit.verify import COPY_SCORE, copy_scores, plain_correlation, thumbnail

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


def scores_of(pairs: list[tuple[Image.Image, Image.Image]]) -> np.ndarray:
    thumbs = np.stack([thumbnail(img) for pair in pairs for img in pair])
    return copy_scores(thumbs, np.arange(0, len(thumbs), 2), np.arange(1, len(thumbs), 2))


def test_every_planted_edit_is_kept(fixture):
    pictures, copies = fixture
    scores = scores_of(list(zip(pictures, copies)))
    kept = scores >= COPY_SCORE
    # Objects on a plain background (coins) and digits: every copy. Textured photo tiles lose most to JPEG at
    # this size: one of the 8 (a coffee tile, 0.965) falls short, as in the calibration table (docs/audit.md).
    assert kept[:24].all() and kept[32:].all(), np.round(scores, 3)
    assert kept[24:32].sum() >= 7 and kept.mean() >= 0.95, np.round(scores[24:32], 3)
    both_ways = scores_of(list(zip(copies, pictures)))  # either image may come first
    np.testing.assert_allclose(both_ways, scores, atol=1e-5)


def test_look_alikes_are_rejected(fixture):
    pictures, _ = fixture
    pairs = list(combinations(range(len(pictures)), 2))
    scores = scores_of([(pictures[a], pictures[b]) for a, b in pairs])
    thumbs = [thumbnail(img) for img in pictures]
    accepted = [(a, b) for (a, b), s in zip(pairs, scores) if s >= COPY_SCORE]
    # No plainly different pair (correlating below 0.9 at 32x32, issue 26's yardstick) passes; among coins and
    # photo tiles, none at all. Two digits 1 that correlate 0.96 unaligned are beyond any pixel check.
    assert all(plain_correlation(thumbs[a], thumbs[b]) >= 0.9 for a, b in accepted), accepted
    assert not [(a, b) for a, b in accepted if b < 32], accepted
    # They are look-alikes: the closest pairs correlate well, just not like copies.
    assert np.sort(scores)[-5:].min() > 0.8


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
    pairs, candidates = find_duplicates([content_hash(i) for i in images], [phash(i) for i in images],
                                        [window_phashes(i) for i in images], np.stack([thumbnail(i) for i in images]))
    n = len(pictures)
    found = {(a, b): (kind, score) for a, b, kind, _, score in pairs}
    assert found[(0, 2 * n)] == ("exact", 1.0)
    near = {(a, b) for (a, b), (kind, _) in found.items() if kind == "near"}
    expected = {(k, k + n) for k in range(n)} | {(k + n, 2 * n) for k in (0,)}  # the first coin's copy twice
    assert len(near & expected) >= 0.95 * len(expected)  # the hash step's recall, here on 41 pairs
    thumbs = [thumbnail(i) for i in images]
    wrong = [(a, b) for a, b in near - expected if b < 32 or plain_correlation(thumbs[a], thumbs[b]) < 0.9]
    assert not wrong  # every candidate that is no copy was rejected, but for digits that are all but the same
    assert candidates >= len(near)
