"""chrF (Popović, 2015) as sacrebleu computes it, for the Translator's validation and test.

Not torchmetrics' ``CHRFScore``: in torchmetrics 1.9 a sentence that shares no n-gram with its reference adds
its output's n-grams but not its reference's (Lightning-AI/torchmetrics#3480), so an empty or wrong output
costs no recall: one right line among empty ones scores 1.0. As a checkpoint monitor that keeps untrained models.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric


def char_ngrams(text: str, n: int) -> Counter[str]:
    """The character n-grams of ``text`` with its whitespace removed (chrF's default)."""
    text = "".join(text.split())
    return Counter(text[i : i + n] for i in range(len(text) - n + 1))


class CharF(Metric):
    """Corpus chrF: per order n = 1..``order``, the n-grams of the outputs, of the references and matched,
    summed over sentences; precision and recall averaged over the orders both sides have, then F-beta.
    Matches ``sacrebleu.corpus_chrf(hyps, [refs]).score / 100`` (one reference per sentence).

    Args:
        order: the longest character n-gram (6, chrF's).
        beta: recall weighs beta times precision (2, chrF's).
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, order: int = 6, beta: float = 2.0) -> None:
        super().__init__()
        self.order, self.beta = order, beta
        # rows: orders 1..order; columns: output n-grams, reference n-grams, matched (integers: summed across ranks)
        self.add_state("counts", default=torch.zeros(order, 3, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, hyps: Sequence[str], refs: Sequence[str]) -> None:
        rows = torch.zeros(self.order, 3, dtype=torch.long)
        for hyp, ref in zip(hyps, refs, strict=True):
            for i in range(self.order):
                h, r = char_ngrams(hyp, i + 1), char_ngrams(ref, i + 1)
                # sacrebleu counts no output n-grams of an order the reference is too short to have
                rows[i, 0] += sum(h.values()) if r else 0
                rows[i, 1] += sum(r.values())
                rows[i, 2] += sum((h & r).values())
        self.counts += rows.to(self.counts.device)

    def compute(self) -> Tensor:
        present = [(m / h, m / r) for h, r, m in self.counts.tolist() if h > 0 and r > 0]
        if not present:
            return torch.tensor(0.0)
        precision = sum(p for p, _ in present) / len(present)
        recall = sum(r for _, r in present) / len(present)
        b2 = self.beta**2
        score = (1 + b2) * precision * recall / (b2 * precision + recall) if precision + recall else 0.0
        return torch.tensor(score)


__all__ = ["CharF", "char_ngrams"]
