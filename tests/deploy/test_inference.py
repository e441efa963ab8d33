"""The runners and the answer (`vit.deploy.inference`): an ONNX export or its folder given where the other goes is named
as such; `answered` and `label_answers`, what `vit predict` and `vit serve` answer, on both kinds of label, against
softmax and sigmoid computed by hand."""

from __future__ import annotations

import math

import pytest
import torch


def test_an_onnx_export_or_its_folder_given_where_the_other_goes_is_named_as_such(tmp_path):
    """`vit attention --ckpt model.onnx` was told the ONNX file was a checkpoint damaged by a kill, and
    `vit predict --ckpt` of the export's folder that it was not found."""
    from vit.checkpoints.io import read_checkpoint
    from vit.deploy.inference import OnnxClassifier

    onnx = tmp_path / "export" / "model.onnx"
    onnx.parent.mkdir()
    onnx.write_bytes(b"\x08\x08\x12\x07pytorch")  # an ONNX protobuf starts with its ir_version field
    with pytest.raises(ValueError, match=r"model\.onnx is an ONNX export.*needs the \.ckpt"):
        read_checkpoint(onnx)
    with pytest.raises(FileNotFoundError, match=r"export is a folder, not an ONNX model; give the file in it"):
        OnnxClassifier(onnx.parent)


# ---- the answer `vit predict` and `vit serve` share (`answered`, `label_answers`), on both kinds of label ----------
class Fixed:
    """A model whose logits are given: image i (its first pixel holds i) gets row i of ``logits``."""

    def __init__(self, logits, names, thresholds=None, calibration=None) -> None:
        self.logits, self.class_names = torch.tensor(logits), names
        self.thresholds, self.calibration = thresholds, calibration

    def __call__(self, images):
        return self.logits[images[:, 0, 0, 0].long()]


class Scored(Fixed):
    """A single-label model with an unknown score per image (what a calibrated checkpoint's `answer` gives)."""

    def __init__(self, logits, names, scores, calibration) -> None:
        super().__init__(logits, names, calibration=calibration)
        self.scores = torch.tensor(scores)

    def answer(self, images):
        return self(images), self.scores[images[:, 0, 0, 0].long()]


def images(n: int):
    return torch.arange(n, dtype=torch.float32)[:, None, None, None].expand(n, 1, 2, 2)


def softmax(row: list[float]) -> list[float]:
    e = [math.exp(v) for v in row]
    return [v / sum(e) for v in e]


def sigmoid(v: float) -> float:
    return 1 / (1 + math.exp(-v))


def test_a_single_label_model_answers_the_top_k_of_its_softmax_at_its_temperature():
    from vit.deploy.confidence import Calibration
    from vit.deploy.inference import answered

    logits, names = [[2.0, 0.0, -1.0], [0.5, 1.5, 1.0]], ["a", "b", "c"]
    for t in (1.0, 2.0):
        got = answered(Fixed(logits, names, calibration=Calibration(temperature=t)), images(2), k=2, tta="none")
        for (top, extra), row, order in zip(got, logits, ([0, 1], [1, 2])):
            p = softmax([v / t for v in row])
            assert top == [{"class": i, "name": names[i], "probability": round(p[i], 6)} for i in order]
            assert extra == {"answer": names[order[0]]}  # no unknown score: the answer is the top class
    assert answered(Fixed(logits, names), images(2), k=1, tta="none")[1][0][0]["probability"] == pytest.approx(
        softmax(logits[1])[1], abs=1e-6)  # uncalibrated: T = 1


def test_a_model_near_chance_keeps_its_logits_order_under_a_huge_temperature():
    """A LoRA fit at chance (val top-1 0.30 of 3 classes) fit T = 181595: softmax(logits / T) in float32 ties
    every class at 1/3, and a ranking by it put class 0 first where the logits (and timm's argmax) say 2."""
    from vit.deploy.confidence import Calibration
    from vit.deploy.inference import answered

    logits, t = [[0.001, 0.002, 0.003], [0.0025, 0.0, 0.005]], 181595.0
    assert all(len(set((torch.tensor(row) / t).softmax(-1).tolist())) == 1 for row in logits)  # float32 ties them
    got = answered(Fixed(logits, ["a", "b", "c"], calibration=Calibration(temperature=t)), images(2), k=3, tta="none")
    assert [[e["name"] for e in top] for top, _ in got] == [["c", "b", "a"], ["c", "a", "b"]]
    assert [extra["answer"] for _, extra in got] == ["c", "c"]
    for (top, _), row in zip(got, logits):  # the probabilities still softmax(logits / T), by hand in float64
        p = softmax([v / t for v in row])
        assert [e["probability"] for e in top] == [round(p[e["class"]], 6) for e in top]


def test_a_scored_single_label_model_says_unknown_only_over_its_threshold():
    from vit.deploy.confidence import DEFAULT_LABEL, Calibration
    from vit.deploy.inference import answered

    logits, names = [[2.0, 0.0], [0.0, 3.0], [1.0, 0.0]], ["a", "b"]
    model = Scored(logits, names, scores=[0.5, 1.5, 1.0], calibration=Calibration(threshold=1.0))
    got = answered(model, images(3), k=1, tta="none")
    assert [extra["unknown"] for _, extra in got] == [False, True, False]  # 1.0 is at the threshold: not over it
    assert [extra["answer"] for _, extra in got] == ["a", DEFAULT_LABEL, "a"]
    # the classes stay the model's: an unknown answer beside them, never in place of them
    assert [top[0]["name"] for top, _ in got] == ["a", "b", "a"] and got[1][1]["score"] == 1.5
    assert all(set(extra) == {"answer", "unknown", "score"} for _, extra in got)  # no rarity, no nearest
    assert not any(extra["unknown"] for _, extra in answered(model, images(3), k=1, accept_all=True, tta="none"))


def test_a_multi_label_model_answers_every_class_at_or_over_its_cut_most_likely_first():
    from vit.deploy.inference import answered

    # sigmoid(0) is 0.5 exactly: class a sits on its cut (in); class c's 0.62 is under its 0.7 (out)
    logits, names, cuts = [[0.0, 2.0, 0.5], [-3.0, -0.1, 1.0]], ["a", "b", "c"], [0.5, 0.85, 0.7]
    got = answered(Fixed(logits, names, thresholds=cuts), images(2), k=2, tta="none")
    for (top, extra), row in zip(got, logits):
        p = [sigmoid(v) for v in row]
        said = sorted((i for i in range(3) if p[i] >= cuts[i]), key=lambda i: -p[i])
        assert extra == {"labels": [{"class": i, "name": names[i], "probability": round(p[i], 6)} for i in said]}
        best = sorted(range(3), key=lambda i: -p[i])[:2]  # the top-k by sigmoid, not softmax
        assert top == [{"class": i, "name": names[i], "probability": round(p[i], 6)} for i in best]
    assert [[e["name"] for e in extra["labels"]] for _, extra in got] == [["b", "a"], ["c"]]


def test_label_answers_with_a_temperature_per_class_cut_at_the_moved_thresholds():
    from vit.deploy.confidence import Calibration
    from vit.deploy.inference import label_answers

    logits, names, cuts = torch.tensor([[1.0, -1.0, 0.4]]), ["a", "b", "c"], [0.5, 0.5, 0.5]
    temperature, moved = [2.0, 0.5, 1.0], [0.6, 0.2, 0.6]  # the calibrated cuts replace the plain ones
    (top, extra), = label_answers(logits, cuts, 3, names, Calibration(temperature=temperature, thresholds=moved))
    p = [sigmoid(v / t) for v, t in zip(logits[0].tolist(), temperature)]
    assert [e["name"] for e in extra["labels"]] == [n for n, q, c in zip(names, p, moved) if q >= c] == ["a"]
    assert [e["probability"] for e in top] == [round(q, 6) for q in sorted(p, reverse=True)]
    (_, plain), = label_answers(logits, cuts, 3, names)  # uncalibrated: the plain sigmoid at the plain cuts
    assert [e["name"] for e in plain["labels"]] == ["a", "c"]


def test_the_label_kind_of_a_loaded_model_is_its_thresholds():
    from vit.deploy.classifier import is_multi_label

    assert is_multi_label(Fixed([[0.0]], ["a"], thresholds=[0.5]))
    assert not is_multi_label(Fixed([[0.0]], ["a"]))
    assert not is_multi_label(object())  # a runner without the attribute answers one label
