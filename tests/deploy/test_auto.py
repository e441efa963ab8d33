"""`--backend auto` (`vit.deploy.auto`, `vit.deploy.backends.load_auto`): a planted backend that is fast and wrong
is never chosen, the tolerances hold on both sides of their bars, the choice weighs build time against the job,
and the second run reads the choice from the cache beside the file instead of timing again."""

from __future__ import annotations

import shutil
import time

import pytest
import torch

import vit.deploy.cpu
from tests.deploy.conftest import ZEN4
from vit.commands.predict import parse_args
from vit.deploy import auto, load_classifier
from vit.deploy.backends import auto_candidates, load_auto

WEIGHT = torch.randn(10, 12, generator=torch.Generator().manual_seed(0))
IMAGES = torch.randn(16, 3, 2, 2, generator=torch.Generator().manual_seed(1))


def slow(seconds: float, change=lambda logits: logits):
    """A model of IMAGES (a fixed linear map) that sleeps ``seconds`` a batch, its logits passed through ``change``."""
    def model(x: torch.Tensor) -> torch.Tensor:
        time.sleep(seconds)
        return change(x.flatten(1) @ WEIGHT.T)
    return model


def wrong(logits: torch.Tensor) -> torch.Tensor:  # every top-1 moved to another class
    return logits.roll(1, dims=-1)


def overconfident(logits: torch.Tensor) -> torch.Tensor:  # same top-1 everywhere, probabilities far off
    return logits * 3


PLANTED = {"reference": slow(0.02), "fast-wrong": slow(0.0, wrong), "fast-overconfident": slow(0.0, overconfident),
           "close": slow(0.01, lambda z: z + 1e-3 * torch.randn(z.shape, generator=torch.Generator().manual_seed(2))),
           # a model unsure of everything: probabilities near 1/10, so answers can all change within 0.05 of them
           "flat": slow(0.02, lambda z: z * 0.01), "flat-wrong": slow(0.0, lambda z: wrong(z * 0.01))}


def choice(tmp_path, names, batch_size=4, **kwargs):
    built = []

    def build(name):
        built.append(name)
        return PLANTED[name]

    (tmp_path / "model.ckpt").write_bytes(b"weights")
    model, chosen = auto.auto_choice(tmp_path / "model.ckpt", names, build, lambda ref: IMAGES, flags="avx2",
                                     threads=1, batch_size=batch_size, budget_s=2, say=lambda line: None, **kwargs)
    return model, chosen, built


def test_a_fast_wrong_backend_is_never_chosen(tmp_path):
    """The planted backends are the fastest by far and never chosen; the close one, faster than the reference, is.
    Without the agreement or the probability check, they would be (the measurements say so)."""
    model, chosen, _ = choice(tmp_path, ["reference", "fast-wrong", "fast-overconfident", "close"])
    results = chosen["results"]
    assert chosen["backend"] == "close" and model is PLANTED["close"]
    assert results["fast-wrong"]["agreement"] == 0.0 and results["fast-wrong"]["img_s"] > results["close"]["img_s"]
    assert results["fast-overconfident"]["agreement"] == 1.0
    assert results["fast-overconfident"]["max_prob_diff"] > auto.PROB_TOLERANCE
    assert results["fast-overconfident"]["img_s"] > results["close"]["img_s"]
    assert results["close"]["img_s"] > results["reference"]["img_s"]
    (tmp_path / "other").mkdir()
    _, chosen, _ = choice(tmp_path / "other", ["reference", "fast-wrong"])
    assert chosen["backend"] == "reference"


def test_the_candidates_are_timed_in_alternation():
    """Each built and checked in turn, then timed round by round (a busy moment slows a round of all, not one)."""
    calls = []

    def build(name):
        def model(x):
            calls.append(name)
            time.sleep(0.002)
            return x.flatten(1) @ WEIGHT.T
        return model

    results = auto.measure(["a", "b"], build, IMAGES, 4, budget_s=0.5, say=lambda line: None)
    runs = [n for i, n in enumerate(calls) if i == 0 or calls[i - 1] != n]  # runs of consecutive calls
    # checks: a, b; rounds: a b | b a | a b, where neighbouring runs of one name merge
    assert runs == ["a", "b", "a", "b", "a", "b"]
    assert auto.ROUNDS == 3 and all(r["img_s"] > 0 for r in results.values())


def test_changed_answers_are_dropped_even_with_close_probabilities(tmp_path):
    _, chosen, _ = choice(tmp_path, ["flat", "flat-wrong"])
    wrong_one = chosen["results"]["flat-wrong"]
    assert wrong_one["max_prob_diff"] <= auto.PROB_TOLERANCE and wrong_one["agreement"] == 0.0
    assert chosen["backend"] == "flat"


@pytest.mark.parametrize(("agreement", "prob_diff", "ok"), [
    (0.99, 0.05, True), (0.9899, 0.05, False), (1.0, 0.0501, False), (1.0, 0.0, True)])
def test_tolerance_bars_on_both_sides(agreement, prob_diff, ok):
    assert auto.acceptable({"img_s": 1.0, "build_s": 0.0, "agreement": agreement, "max_prob_diff": prob_diff}) is ok
    assert not auto.acceptable({"error": "not measured: the time budget was spent"})


def test_the_choice_weighs_build_time_against_the_job():
    """A: 10 s to build, 1000 img/s; B: no build, 100 img/s. 100 images: A 10.1 s, B 1 s. 10,000 images: A 20 s,
    B 100 s. A server (no workload): A, the faster per image."""
    results = {"A": {"build_s": 10.0, "img_s": 1000.0, "agreement": 1.0, "max_prob_diff": 0.0},
               "B": {"build_s": 0.0, "img_s": 100.0, "agreement": 1.0, "max_prob_diff": 0.0}}
    assert auto.choose(results, 100) == "B"
    assert auto.choose(results, 10_000) == "A"
    assert auto.choose(results, None) == "A"


def test_the_second_run_reads_the_cache_and_a_changed_key_measures_again(tmp_path):
    _, first, built = choice(tmp_path, ["reference", "close"])
    assert not first["cached"] and built == ["reference", "close"]
    store = tmp_path / "model.ckpt.backends.json"
    assert first["cache"] == str(store) and store.is_file()
    model, second, built = choice(tmp_path, ["reference", "close"])  # the same bytes again: the same key
    assert second["cached"] and second["backend"] == "close" and built == ["close"] and model is PLANTED["close"]
    _, other_batch, built = choice(tmp_path, ["reference", "close"], batch_size=8)
    assert not other_batch["cached"] and built == ["reference", "close"]


def test_a_changed_file_is_measured_again(tmp_path):
    choice(tmp_path, ["reference", "close"])
    (tmp_path / "model.ckpt").write_bytes(b"other weights")
    built = []
    auto.auto_choice(tmp_path / "model.ckpt", ["reference", "close"], lambda name: built.append(name) or PLANTED[name],
                     lambda ref: IMAGES, flags="avx2", threads=1, batch_size=4, budget_s=2, say=lambda line: None)
    assert built == ["reference", "close"]


def test_auto_on_the_trained_digits_model(trained, tmp_path, monkeypatch):
    """The real candidates on a copy of the digits checkpoint (the shared one stays unwritten): every measured one
    within tolerance of eager, the choice among them, and a second load from the cache."""
    ckpt = tmp_path / "digits.ckpt"
    shutil.copy(trained["ckpt"], ckpt)
    names = auto_candidates(ckpt)
    assert names[0] == "torch" and "openvino" in names and "torch-compile" not in names
    model = load_auto(ckpt, batch_size=8, sample=trained["images"][:16], threads=1, budget_s=5)
    assert model.auto["backend"] == getattr(model, "backend", "torch")
    assert not model.auto["cached"] and set(model.auto["results"]) == set(names)
    again = load_classifier(ckpt, backend="auto", batch_size=8, threads=1)
    assert again.auto["cached"] and again.auto["backend"] == model.auto["backend"]
    with torch.no_grad():
        eager = load_classifier(ckpt)(trained["images"])
        assert (again(trained["images"]).float().argmax(-1) == eager.argmax(-1)).float().mean() >= 0.99
    monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda: ZEN4 - {"avx512_bf16"})  # no bf16 units: none of bf16
    assert not any("bf16" in n for n in auto_candidates(ckpt))
    assert auto_candidates(trained["int8"]) == ["onnx-int8", "openvino-int8"]
    assert auto_candidates(trained["fp32"]) == ["onnx", "openvino"]


def test_predict_takes_auto():
    assert parse_args(["--ckpt", "m.ckpt", "x.png", "--backend", "auto"]).backend == "auto"
