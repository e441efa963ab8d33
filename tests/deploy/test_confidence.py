"""Calibrated probabilities and the "unknown" answer (`vit.deploy.calibration`, `vit.deploy.confidence`): the temperature,
the score and the threshold against independent computations (scipy, numpy), and `vit calibrate` -> `vit predict`
on the checkpoint and on its ONNX export giving the same answers."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax, softmax

from tests.conftest import DIGITS
from vit.deploy.calibration import (
    calibrate_checkpoint,
    calibration_figures,
    fit_temperature,
    fit_unknown,
    threshold_at,
)
from vit.commands import main, run
from vit.deploy.confidence import calibrated_probabilities, decisions
from vit.errors import UserValueError


def overconfident(n: int = 600, classes: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits 4x too sharp for labels drawn from their own softmax at T = 4."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, classes)) * 3
    labels = np.array([rng.choice(classes, p=p) for p in softmax(logits, 1)])
    return torch.tensor(logits * 4), torch.tensor(labels)


def test_temperature_is_the_nll_minimum_and_changes_no_argmax():
    logits, labels = overconfident()
    t = fit_temperature(logits, labels)
    nll = lambda temp: -log_softmax(logits.numpy() / temp, 1)[np.arange(len(labels)), labels.numpy()].mean()
    expected = minimize_scalar(nll, bounds=(0.05, 50), method="bounded", options={"xatol": 1e-6}).x
    assert t == pytest.approx(expected, rel=1e-3) and 3 < t < 5  # the T the labels were drawn at
    probs = calibrated_probabilities(logits, SimpleNamespace(temperature=t))
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))  # top-1 never changes
    before, after = calibration_figures(logits, labels), calibration_figures(logits, labels, t)
    assert after["ece"] < before["ece"] / 2 and after["nll"] < before["nll"] and after["brier"] < before["brier"]
    # ECE by hand: 15 equal-width bins of the top probability, |accuracy - confidence| weighted by the bin's share
    top = softmax(logits.numpy() / t, 1)
    conf, right = top.max(1), top.argmax(1) == labels.numpy()
    bins = np.minimum((conf * 15).astype(int), 14)
    ece = sum(abs(right[bins == b].mean() - conf[bins == b].mean()) * (bins == b).mean() for b in set(bins))
    assert after["ece"] == pytest.approx(ece, abs=1e-4)


def test_threshold_and_score_match_numpy():
    rng = np.random.default_rng(1)
    scores = torch.tensor(rng.normal(size=179))
    threshold = threshold_at(scores, 0.95)
    assert threshold == np.sort(scores.numpy())[int(np.ceil(0.95 * 179)) - 1]  # the 171st of 179 (>= 95%)
    assert 0.95 <= (scores <= threshold).double().mean() < 0.95 + 1 / 179
    with pytest.raises(UserValueError, match="acceptance must be in"):
        threshold_at(scores, 1.5)
    # Mahalanobis on L2-normalised features, one shared covariance, by hand
    features, labels = rng.normal(size=(300, 8)) + np.repeat(np.eye(3, 8) * 3, 100, 0), np.repeat(np.arange(3), 100)
    unknown = fit_unknown(torch.tensor(features), torch.tensor(labels), 3)
    z = features / np.linalg.norm(features, axis=1, keepdims=True)
    means = np.stack([z[labels == c].mean(0) for c in range(3)])
    cov = np.cov(z - means[labels], rowvar=False, bias=True)
    precision = np.linalg.inv(0.999 * cov + 0.001 * np.trace(cov) / 8 * np.eye(8))  # shrunk 0.1% towards I
    queries = rng.normal(size=(20, 8)) * 2
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    d = np.stack([np.einsum("nd,de,ne->n", q - m, precision, q - m) for m in means], 1)
    score, nearest = unknown(torch.tensor(queries, dtype=torch.float32))
    np.testing.assert_allclose(score.numpy(), d.min(1), rtol=1e-4, atol=1e-3)
    assert nearest.tolist() == d.argmin(1).tolist()
    # two layers: each distance standardised by its mean and standard deviation on val, then summed
    other = rng.normal(size=(300, 4)) + np.repeat(np.eye(3, 4) * 2, 100, 0)
    val = [torch.tensor(queries), torch.tensor(rng.normal(size=(20, 4)))]
    both = fit_unknown([torch.tensor(features), torch.tensor(other)], torch.tensor(labels), 3, val=val)
    per_layer = [layer(v.float())[0].double().numpy() for layer, v in zip(both.layers, val)]
    np.testing.assert_allclose(per_layer[0], d.min(1), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(both.loc.numpy(), [p.mean() for p in per_layer], rtol=1e-5)
    np.testing.assert_allclose(both.scale.numpy(), [p.std() for p in per_layer], rtol=1e-5)
    summed = sum((p - p.mean()) / p.std() for p in per_layer)
    np.testing.assert_allclose(both(val)[0].numpy(), summed, rtol=1e-4, atol=1e-4)
    assert decisions(score, SimpleNamespace(threshold=float(np.median(d.min(1)))), accept_all=True) == [False] * 20
    with pytest.raises(UserValueError, match=r"no images of class\(es\) \[2\]"):
        fit_unknown(torch.tensor(features[:200]), torch.tensor(labels[:200]), 3)


@pytest.fixture(scope="module")
def calibrated(fitted, tmp_path_factory) -> tuple[Path, str]:
    """The `fitted` checkpoint, calibrated by `vit calibrate` into a copy; what it printed."""
    root = tmp_path_factory.mktemp("calibrated")
    ckpt = root / "calibrated.ckpt"
    shutil.copy(next((fitted / "ckpt").glob("best-*.ckpt")), ckpt)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(["calibrate", "--ckpt", str(ckpt), "--config", DIGITS])
    return ckpt, printed.getvalue()


def images(folder: Path) -> list[Path]:
    """12 test digits, 4 noise images and 2 flat ones, as 8x8 PNGs."""
    from sklearn.datasets import load_digits

    folder.mkdir(exist_ok=True)
    digits, rng = load_digits(), np.random.default_rng(0)
    pictures = [np.clip(digits.images[-i] * 16, 0, 255) for i in range(1, 13)]
    pictures += [rng.integers(0, 256, (8, 8)) for _ in range(4)] + [np.full((8, 8), v) for v in (0, 255)]
    paths = [folder / f"{i:02d}.png" for i in range(len(pictures))]
    for path, pixels in zip(paths, pictures):
        Image.fromarray(np.asarray(pixels, np.uint8)).save(path)
    return paths


def by_hand(ckpt: Path, paths: list[Path]) -> tuple[np.ndarray, np.ndarray, dict]:
    """Calibrated probabilities and scores from the stored numbers, with numpy on the model's pooled features."""
    from vit.checkpoints.io import read_checkpoint
    from vit.deploy.classifier import read_classifier

    stored = read_checkpoint(ckpt)["confidence"]
    classifier = read_classifier(ckpt)
    model, transform = classifier.model, classifier.eval_transform()
    x = torch.stack([transform(Image.open(p).convert("L")) for p in paths])
    blocks = []  # every block's mean patch token, then the pooled features
    with torch.no_grad():
        model.tokens(x, on_block=lambda i, t: blocks.append(t[:, model.num_prefix_tokens:].mean(1).double().numpy()))
        pooled = model.forward_head(model.forward_features(x), pre_logits=True).double().numpy()
        logits = model(x).double().numpy()
    stats, score = stored["stats"], 0.0
    read = [*blocks, pooled] if len(stats["layers"]) > 1 else [pooled]  # all layers, or --layers pooled
    assert len(stats["layers"]) == len(read)
    for features, layer, loc, scale in zip(read, stats["layers"], stats["loc"], stats["scale"]):
        z = features / np.linalg.norm(features, axis=1, keepdims=True)
        means, precision = layer["means"].double().numpy(), layer["precision"].double().numpy()
        d = np.stack([np.einsum("nd,de,ne->n", z - m, precision, z - m) for m in means], 1)
        score = score + (d.min(1) - float(loc)) / float(scale)
    return softmax(logits / stored["temperature"], 1), score, stored


def test_calibrate_then_predict_answers_unknown_alike_on_checkpoint_and_onnx(calibrated, tmp_path, capsys):
    from vit.deploy.classifier import read_classifier
    from vit.deploy.export import export_onnx

    ckpt, printed = calibrated
    assert "temperature T = " in printed and "val ECE" in printed and f"calibrated {ckpt}" in printed
    paths = images(tmp_path / "images")
    probs, scores, stored = by_hand(ckpt, paths)
    assert stored["threshold"] > 0 and stored["acceptance"] == 0.95 and stored["label"] == "unknown"
    unknown = scores > stored["threshold"]
    assert unknown.any() and not unknown.all()  # both sides of the threshold are exercised
    export_onnx(read_classifier(ckpt), tmp_path / "onnx")
    onnx = tmp_path / "onnx" / "model.onnx"
    for model, backend in ((ckpt, "torch"), (onnx, "onnx"), (onnx, "openvino")):
        out = tmp_path / f"{backend}.json"
        rows = run(["predict", "--ckpt", str(model), *map(str, paths), "--out", str(out), "--top_k", "10",
                    "--backend", backend])
        assert [r["unknown"] for r in rows] == unknown.tolist(), backend
        assert [r["answer"] for r in rows] == [
            "unknown" if u else r["nearest"] for u, r in zip(unknown, rows)]
        np.testing.assert_allclose([r["score"] for r in rows], scores, rtol=1e-4, atol=1e-4)
        got = np.zeros_like(probs)
        for i, r in enumerate(rows):
            got[i, [e["class"] for e in r["top_k"]]] = [e["probability"] for e in r["top_k"]]
        np.testing.assert_allclose(got, probs, atol=1e-5)
        assert [r["nearest"] for r in rows] == [str(i) for i in probs.argmax(1)]
    assert "no unknown score" not in capsys.readouterr().out
    # the CSV: the unknown label as class_1 (no probability), the nearest class and the score in their own columns
    main(["predict", "--ckpt", str(ckpt), *map(str, paths), "--out", str(tmp_path / "p.csv")])
    table = list(csv.DictReader((tmp_path / "p.csv").open()))
    for row, u, s in zip(table, unknown, scores):
        assert (row["class_1"] == "unknown") == u and (row["prob_1"] == "") == u
        assert float(row["unknown_score"]) == pytest.approx(s, rel=1e-4, abs=1e-4) and row["nearest"] in "0123456789"
    # --accept_all: every image gets its class
    rows = run(["predict", "--ckpt", str(ckpt), *map(str, paths), "--out", str(tmp_path / "a.json"), "--accept_all"])
    assert not any(r["unknown"] for r in rows) and all(r["answer"] == r["nearest"] for r in rows)


def test_an_old_onnx_answers_and_says_it_cannot_reject(exported, tmp_path, capsys):
    out = tmp_path / "old.json"
    rows = run(["predict", "--ckpt", str(exported.onnx), str(images(tmp_path / "images")[0]), "--out", str(out)])
    assert "has no unknown score" in capsys.readouterr().out
    assert rows[0]["top_k"] and rows[0]["error"] is None and "unknown" not in rows[0]


def test_calibrating_without_a_validation_split_says_so(fitted):
    ckpt = next((fitted / "ckpt").glob("best-*.ckpt"))
    with pytest.raises(UserValueError, match="has no validation split") as error:
        calibrate_checkpoint(ckpt, SimpleNamespace(val_set=None))
    assert "val_fraction" in str(error.value) and len(str(error.value).splitlines()) == 1


def test_fit_ends_by_calibrating_its_best_checkpoint(tmp_path, capsys):
    from tests.conftest import short_digits_run
    from vit.checkpoints.io import read_checkpoint

    main(["fit", *short_digits_run(tmp_path), "--calibrate=true"])
    last_lines = capsys.readouterr().out.strip().splitlines()[-4:]
    best = next((tmp_path / "ckpt").glob("best-*.ckpt"))
    assert last_lines[-1].startswith(f"calibrated {best}: vit predict and vit serve answer")
    assert any(line.startswith("temperature T = ") for line in last_lines)
    stored = read_checkpoint(best)["confidence"]
    layers = stored["stats"]["layers"]  # the one block's mean patch token and the pooled features
    assert stored["temperature"] > 0 and [layer["precision"].shape for layer in layers] == [(32, 32)] * 2
    json.dumps({k: v for k, v in stored.items() if k != "stats"})  # the report is plain data


@pytest.mark.parametrize("accept_all", [False, True])
def test_serve_answers_as_predict_does_on_the_checkpoint_and_the_onnx(calibrated, tmp_path, accept_all):
    import asyncio

    from tests.serve.conftest import client_of, make_app
    from vit.deploy import load_classifier
    from vit.deploy.classifier import read_classifier
    from vit.deploy.export import export_onnx
    from vit.serve.core import Predictor

    ckpt, _ = calibrated
    paths = images(tmp_path / "images")
    probs, scores, stored = by_hand(ckpt, paths)
    unknown = (scores > stored["threshold"]) & (not accept_all)
    assert unknown.any() != accept_all
    export_onnx(read_classifier(ckpt), tmp_path / "onnx")

    async def answers(model: Path) -> list[dict]:
        async with client_of(make_app(Predictor(load_classifier(model), accept_all=accept_all))) as client:
            info = (await client.get("/info")).json()
            assert info["calibration"]["threshold"] == pytest.approx(stored["threshold"])
            return [(await client.post("/predict", content=p.read_bytes(),
                                       headers={"Content-Type": "image/png"})).json() for p in paths]

    for model in (ckpt, tmp_path / "onnx" / "model.onnx"):
        got = asyncio.run(answers(model))
        assert [a["unknown"] for a in got] == unknown.tolist(), model
        assert [a["answer"] for a in got] == ["unknown" if u else str(i) for u, i in zip(unknown, probs.argmax(1))]
        np.testing.assert_allclose([a["top_k"][0]["probability"] for a in got], probs.max(1), atol=1e-5)
        np.testing.assert_allclose([a["score"] for a in got], scores, rtol=1e-4, atol=1e-4)


def test_an_outlier_folder_sets_the_best_separating_threshold(fitted, tmp_path):
    from vit.deploy.calibration import threshold_between
    from vit.data import Digits

    rng = np.random.default_rng(2)
    inside, outside = rng.normal(size=50), rng.normal(size=30) + 1.5
    accuracy = lambda t: ((inside <= t).mean() + (outside > t).mean()) / 2
    best = max(np.r_[inside, outside], key=accuracy)  # by brute force over every candidate
    assert threshold_between(torch.tensor(inside), torch.tensor(outside)) == pytest.approx(best)
    # a threshold folder without images: a short message naming it
    ckpt = tmp_path / "c.ckpt"
    shutil.copy(next((fitted / "ckpt").glob("best-*.ckpt")), ckpt)
    data = Digits(img_size=16)
    data.setup("fit")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images here")
    with pytest.raises(UserValueError, match=f"the threshold folder {tmp_path / 'empty'} holds no image files"):
        calibrate_checkpoint(ckpt, data, outliers=tmp_path / "empty")
    # noise and flat images as the outliers: the stored threshold is the one that separates val from them
    folder = tmp_path / "outliers"
    folder.mkdir()
    for i, path in enumerate(images(tmp_path / "images")[12:]):
        shutil.copy(path, folder / f"{i}.png")
    confidence = calibrate_checkpoint(ckpt, data, outliers=folder, say=lambda line: None)
    _, outlier_scores, stored = by_hand(ckpt, sorted(folder.glob("*.png")))
    assert stored["threshold"] == confidence.calibration.threshold
    assert (outlier_scores > stored["threshold"]).mean() >= 0.5


def test_the_pooled_features_alone_on_request(fitted, tmp_path):
    from vit.data import Digits

    ckpt = tmp_path / "c.ckpt"
    shutil.copy(next((fitted / "ckpt").glob("best-*.ckpt")), ckpt)
    data = Digits(img_size=16)
    data.setup("fit")
    calibrate_checkpoint(ckpt, data, layers="pooled", say=lambda line: None)
    paths = images(tmp_path / "images")
    _, scores, stored = by_hand(ckpt, paths)
    assert len(stored["stats"]["layers"]) == 1 and stored["stats"]["loc"].tolist() == [0.0]
    rows = run(["predict", "--ckpt", str(ckpt), *map(str, paths), "--out", str(tmp_path / "p.json")])
    assert [r["unknown"] for r in rows] == (scores > stored["threshold"]).tolist()
    np.testing.assert_allclose([r["score"] for r in rows], scores, rtol=1e-4, atol=1e-4)
    with pytest.raises(UserValueError, match="layers must be 'all' or 'pooled'"):
        calibrate_checkpoint(ckpt, data, layers="some")


def test_the_model_card_states_the_checkpoints_temperature_and_threshold(calibrated, tmp_path):
    from huggingface_hub import ModelCard

    ckpt, _ = calibrated
    main(["export", "--ckpt", str(ckpt), "--format", "hub", "--out", str(tmp_path / "hub")])
    stored = torch.load(ckpt, map_location="cpu", weights_only=False)["confidence"]  # read apart from vit
    text = ModelCard.load(tmp_path / "hub" / "README.md").text
    assert f"temperature T = {stored['temperature']:.4f}" in text and "divide them by T" in text
    assert f"above {stored['threshold']:.4g}" in text and f'"{stored["label"]}"' in text
    assert f"validation ECE {stored['report']['before']['ece']:.4f} before" in text
