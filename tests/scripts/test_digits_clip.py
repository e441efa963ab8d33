"""scripts/experiments/digits_clip.py's parts that decide what its figures mean: batches of different digits, the
held-out templates kept out of training, and one tiny run end to end (the figures are in docs/zeroshot.md)."""

import pytest

from tests import load_script
from vit.data.captions import CaptionSampler


@pytest.mark.parametrize(("counts", "batch_size"), [((5, 5, 4, 3, 3), 5), ((7, 2, 2, 1), 2), ((3, 3, 3), 3)])
def test_distinct_digits_batches_hold_different_digits_and_their_count_is_exact(counts, batch_size):
    clip = load_script("digits_clip")
    labels = [digit for digit, n in enumerate(counts) for _ in range(n)]
    sampler = CaptionSampler(len(labels), seed=3)
    batches = clip.DistinctDigits(sampler, labels, batch_size)
    seen = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        drawn = list(batches)
        assert len(drawn) == len(batches)  # what Lightning counts the epoch's steps by
        for batch in drawn:
            assert len(batch) == batch_size and len({labels[i % len(labels)] for i in batch}) == batch_size
            assert all(i // len(labels) == epoch for i in batch)  # the indices carry the epoch (caption draw)
        flat = [i % len(labels) for batch in drawn for i in batch]
        assert len(set(flat)) == len(flat)  # no image twice in an epoch
        seen.append(drawn)
    # the count by hand: (5,5,4,3,3) in 5s: 3 batches; (7,2,2,1) in pairs: 5 (7 with each other digit); 3s: 3
    assert len(seen[0]) == {5: 3, 2: 5, 3: 3}[batch_size]
    sampler.set_epoch(1)
    assert list(batches) == seen[1]  # the seed and the epoch fix the batches


def test_no_training_caption_holds_a_held_out_phrasing():
    clip = load_script("digits_clip")
    training = [c for d in range(10) for c in clip.captions(d, clip.TEN_TEMPLATES + clip.MORE_TEMPLATES)]
    assert len(training) == 10 * len(clip.TEN_TEMPLATES + clip.MORE_TEMPLATES) == 380
    for phrase in ("a picture of", "a photo of the digit", "this is a", "picture", "photo", "this"):
        assert not [c for c in training if phrase in c.split() or phrase in c], phrase
    assert clip.HELD_OUT == ("a picture of {}", "a photo of the digit {}", "this is a {}")
    names = [(str(d), clip.WORDS[d]) for d in range(10)]
    for digit in range(10):  # every caption names its digit, as a numeral or a word, and no other digit
        for caption in clip.captions(digit, clip.TEN_TEMPLATES + clip.MORE_TEMPLATES):
            named = {d for d, pair in enumerate(names) if set(pair) & set(caption.replace(":", "").split())}
            assert named == {digit}, caption
