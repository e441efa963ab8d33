"""chrF as sacrebleu computes it (`vit.tasks.text_metrics`), on the lines torchmetrics 1.9's CHRFScore miscounts."""

from __future__ import annotations

import pytest
import sacrebleu

from vit.tasks.text_metrics import CharF


@pytest.mark.parametrize("hyps, refs", [
    (["", "abcdefgh"], ["abc", "abcdefgh"]),  # an empty output costs its reference's recall
    (["xyz", "abcdefgh"], ["abc", "abcdefgh"]),  # so does one that matches nothing (torchmetrics 1.9: 0.97)
    (["abcdefgh", "ab"], ["abc", "abcd"]),  # references shorter than the 6-grams, outputs longer
    (["a b c", "", ""], ["abc", "d", "ef"]),  # whitespace is not a character; nothing of two lines right
    (["", ""], ["ab", "cd"]),  # nothing at all
    (["xyz", "uvw"], ["abc", "def"]),  # n-grams on both sides, none shared: 0, not the F of nothing
])
def test_chrf_is_sacrebleus_on_empty_wrong_and_short_lines(hyps, refs):
    metric = CharF()
    for i in range(len(hyps)):  # a line a batch: the counts add up across updates
        metric.update(hyps[i : i + 1], refs[i : i + 1])
    assert metric.compute().item() == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score / 100, abs=1e-6)
