"""The label kind's evaluation (`vit.tasks.evaluation`), as the classifier drives it (start, step per batch, end), fed
the same logits as torchmetrics' functional metrics and sklearn's cut computed here, batch by batch against all at
once: single-label accuracy, per-class accuracy and confusion; multi-label thresholds, mAP and F1; what each writes
into a checkpoint and reads back."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchmetrics.functional.classification import (
    multiclass_accuracy,
    multiclass_confusion_matrix,
    multilabel_average_precision,
    multilabel_exact_match,
    multilabel_f1_score,
    multilabel_hamming_distance,
)

from tests.tasks.test_multilabel import sklearn_cut
from vit.tasks.evaluation import Run
from vit.tasks.heads import MultiLabelHead, SingleLabelHead

NAMES = [f"c{i}" for i in range(10)]


def run(tmp_path=None, names: list[str] = NAMES, **kwargs) -> Run:
    """A run of 1-channel images normalised by 0.5/0.5, drawing into ``tmp_path`` (None: no figures)."""
    return Run(names, [0.5], [0.5], nn.Linear(1, 1), None if tmp_path is None else str(tmp_path), **kwargs)


def fed(evaluation, stage: str, logits: torch.Tensor, targets: torch.Tensor, batch: int = 16) -> list:
    """The batches as the classifier's steps give them (images of each batch's size); what each step logs."""
    evaluation.start(stage, None)
    images = torch.rand(len(logits), 1, 8, 8)
    return [evaluation.step(stage, images[i:i + batch], logits[i:i + batch], targets[i:i + batch])
            for i in range(0, len(logits), batch)]


def test_single_label_evaluation_gives_torchmetrics_numbers_and_each_class_its_accuracy(tmp_path):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(70, 10, generator=g)
    labels = torch.randint(0, 9, (70,), generator=g)  # class 9 has no test image
    logits[labels == 3, 3] += 3.0  # class 3 mostly right, so the classes differ
    evaluation = SingleLabelHead().evaluation(10)
    logged = fed(evaluation, "test", logits, labels)[-1]  # the stage's metrics: Lightning computes them per epoch
    got = {k: float(v) for k, v in logged.compute().items()}
    assert got["test_acc"] == pytest.approx(float(multiclass_accuracy(logits, labels, 10, average="micro")))
    assert got["test_acc"] == pytest.approx((logits.argmax(1) == labels).float().mean().item())
    assert got["test_acc_balanced"] == pytest.approx(float(multiclass_accuracy(logits, labels, 10, average="macro")))
    top5 = multiclass_accuracy(logits, labels, 10, top_k=5, average="micro")
    assert got["test_acc_top5"] == pytest.approx(float(top5))
    wrong = int((logits.argmax(1) != labels).sum())
    assert len(evaluation.mistakes) == min(16, wrong)

    values = evaluation.end("test", run(tmp_path))
    predicted = logits.argmax(1)
    assert values == pytest.approx({f"test_acc_class/c{c}": ((predicted == c) & (labels == c)).sum().item() /
                                    (labels == c).sum().item() for c in range(9)})  # c9: none, so left out
    assert torch.equal(evaluation.last_confusion_matrix, multiclass_confusion_matrix(logits, labels, 10))
    assert len(evaluation.mistakes) == 0  # forgotten for the next test
    assert {p.name for p in tmp_path.iterdir()} == {"confusion_matrix.png", "class_accuracy.png", "errors.png"}
    assert evaluation.checkpoint_meta() == {}  # nothing of its own in the checkpoint


def test_single_label_validation_keeps_its_own_metrics_and_draws_nothing(tmp_path):
    logits, labels = torch.randn(20, 10), torch.randint(0, 10, (20,))
    evaluation = SingleLabelHead().evaluation(10)
    logged = fed(evaluation, "val", logits, labels)[-1]
    assert float(logged.compute()["val_acc"]) == pytest.approx((logits.argmax(1) == labels).float().mean().item())
    assert evaluation.end("val", run(tmp_path)) == {} and not list(tmp_path.iterdir())
    assert len(evaluation.mistakes) == 0 and evaluation.confusion.update_count == 0  # test's alone


def multi_label_case(n: int = 130, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (n, 4) that lean toward the 0/1 targets, a tenth of the targets unknown (-1)."""
    g = torch.Generator().manual_seed(seed)
    targets = (torch.rand(n, 4, generator=g) < 0.35).float()
    logits = 2.0 * targets - 1.0 + 1.2 * torch.randn(n, 4, generator=g)
    targets[torch.rand(n, 4, generator=g) < 0.1] = -1.0
    return logits, targets


def label_figures(probs: torch.Tensor, targets: torch.Tensor, cuts: torch.Tensor, stage: str) -> dict[str, float]:
    """The multi-label numbers by torchmetrics' functional metrics, unknown labels (-1) left out."""
    labels, decided = targets.long(), (probs >= cuts).long()
    want = {"map": multilabel_average_precision(probs, labels, 4, average="macro", ignore_index=-1),
            "f1_micro": multilabel_f1_score(decided, labels, 4, average="micro", ignore_index=-1),
            "f1_macro": multilabel_f1_score(decided, labels, 4, average="macro", ignore_index=-1)}
    if stage == "test":
        want["exact_match"] = multilabel_exact_match(decided, labels, 4, ignore_index=-1)
        want["hamming_loss"] = multilabel_hamming_distance(decided, labels, 4, average="micro", ignore_index=-1)
    return {f"{stage}_{k}": float(v) for k, v in want.items()}


def test_multi_label_evaluation_chooses_sklearns_cut_on_val_and_tests_at_it(tmp_path):
    logits, targets = multi_label_case()
    probs = logits.sigmoid()
    evaluation = MultiLabelHead().evaluation(4)
    assert fed(evaluation, "val", logits, targets) == [{}] * 9  # nothing per batch: every image at once, at the end

    # Lightning's sanity check: measured at the default cut, nothing chosen
    assert evaluation.end("val", run(counted=False)) == pytest.approx(label_figures(probs, targets, 0.5, "val"))
    assert evaluation.thresholds.tolist() == [0.5] * 4
    fed(evaluation, "val", logits, targets)
    values = evaluation.end("val", run())
    for c in range(4):
        known = targets[:, c] >= 0
        want = sklearn_cut(probs[known, c].numpy(), targets[known, c].numpy() == 1)
        assert evaluation.thresholds[c].item() == pytest.approx(want, abs=1e-6)
    assert values == pytest.approx(label_figures(probs, targets, evaluation.thresholds, "val"), abs=1e-6)

    test_logits, test_targets = multi_label_case(67, seed=1)
    fed(evaluation, "test", test_logits, test_targets)
    values = evaluation.end("test", run(tmp_path, NAMES[:4]))
    want = label_figures(test_logits.sigmoid(), test_targets, evaluation.thresholds, "test")
    assert values == pytest.approx(want, abs=1e-6)
    assert {p.name for p in tmp_path.iterdir()} == {"class_ap.png", "label_cooccurrence.png", "label_errors.png"}
    assert not evaluation.mistakes.items()  # forgotten for the next test


def test_multi_label_thresholds_travel_in_the_checkpoint_and_figures_only_on_rank_zero(tmp_path):
    logits, targets = multi_label_case()
    chosen = MultiLabelHead().evaluation(4)
    fed(chosen, "val", logits, targets)
    chosen.end("val", run())
    meta = chosen.checkpoint_meta()
    assert meta == {"multi_label": True, "thresholds": pytest.approx(chosen.thresholds.tolist())}
    assert chosen.thresholds.tolist() != [0.5] * 4
    loaded = MultiLabelHead().evaluation(4)
    loaded.load_meta({"task": "classify", **meta})
    assert torch.equal(loaded.thresholds, chosen.thresholds)
    loaded.load_meta({"task": "classify"})  # a file without them: the thresholds stay
    assert torch.equal(loaded.thresholds, chosen.thresholds)

    fed(loaded, "test", logits, targets)
    loaded.end("test", run(tmp_path, NAMES[:4], is_global_zero=False))  # rank 1 draws nothing
    assert not list(tmp_path.iterdir())
