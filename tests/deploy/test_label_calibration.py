"""A temperature per class for a multi-label checkpoint (`vit.deploy.label_calibration`): each T_c is its class's BCE
minimum (scipy), the moved thresholds keep every image's labels (numpy), the figures are the hand formulas, and
`vit predict`, `vit serve` and the ONNX / OpenVINO runners answer the same calibrated probabilities (numpy on the
stored numbers); an ONNX exported before still answers as before."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import expit, logit

from tests.helpers import TINY_DIM
from vit.deploy.confidence import Calibration
from vit.deploy.label_calibration import (
    fit_label_temperatures,
    label_figures,
    label_sets,
    moved_thresholds,
)
from vit.errors import UserValueError


def bce(z: np.ndarray, y: np.ndarray) -> float:
    """The mean binary cross-entropy of sigmoid(z) against 0/1 labels, stably (log(1 + e^-|z|))."""
    return float(np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))))


def overconfident(n: int = 600, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """Logits of 5 classes: labels drawn from sigmoid(u), logits u x scale (over- and under-confident); class 2
    all positive (one outcome), class 3 separable at 0 (no BCE minimum); a share of class 0's labels unknown (-1)."""
    rng = np.random.default_rng(seed)
    u = rng.normal(0, 2, (n, 5))
    y = (rng.random((n, 5)) < expit(u)).astype(float)
    scales = [3.0, 0.5, 2.0, 1.0, 1.5]
    z = u * scales
    y[:, 2] = 1.0
    y[:, 3] = (z[:, 3] > 0).astype(float)
    y[rng.random(n) < 0.2, 0] = -1.0
    return torch.tensor(z), torch.tensor(y), scales


def test_each_temperature_is_its_classes_bce_minimum_and_classes_without_one_keep_1():
    logits, targets, scales = overconfident()
    got = fit_label_temperatures(logits, targets)
    z, y = logits.numpy(), targets.numpy()
    for c in (0, 1, 4):  # scipy, one class at a time, over the known labels only
        known = y[:, c] >= 0
        zc, yc = z[known, c], y[known, c]
        best = minimize_scalar(lambda s, zc=zc, yc=yc: bce(zc / np.exp(s), yc), bounds=(-5, 5), method="bounded",
                               options={"xatol": 1e-9})
        assert got[c] == pytest.approx(np.exp(best.x), rel=1e-4)
        assert got[c] == pytest.approx(scales[c], rel=0.3)  # and near the scale the logits were inflated by
    assert got[2] == 1.0 and got[3] == 1.0  # one outcome; separable at 0 (the BCE falls as T -> 0)
    # the unknown labels are left out: marking them 0 instead moves class 0's T
    assert fit_label_temperatures(logits, targets.clamp_min(0))[0] != pytest.approx(got[0], rel=1e-3)


def test_classes_with_few_mistakes_take_the_minimum_of_every_classs_pooled_bce():
    """One barely wrong label sets its class's own T near 0 (the case seen: T_c = 0.014 on a 20-image val set).
    Classes with fewer than MIN_MISTAKES (5) wrong labels take the minimum of the BCE pooled over every class with
    a minimum (scipy); a class with enough keeps its own; a pool with too few mistakes keeps 1."""
    from vit.deploy.label_calibration import MIN_MISTAKES

    rng = np.random.default_rng(2)
    z = rng.normal(0, 3, (20, 3))
    y = (z > 0).astype(float)
    z[0, 0], y[0, 0] = -0.01, 1.0  # class 0: one label, barely wrong
    y[1:5, 1] = 1 - y[1:5, 1]  # class 1: 4 wrong
    y[:8, 2] = 1 - y[:8, 2]  # class 2: 8 wrong, a T of its own
    assert MIN_MISTAKES == 5

    def minimum(zs: np.ndarray, ys: np.ndarray) -> float:
        best = minimize_scalar(lambda s: bce(zs / np.exp(s), ys), bounds=(-8, 5), method="bounded",
                               options={"xatol": 1e-10})
        return float(np.exp(best.x))

    assert minimum(z[:, 0], y[:, 0]) < 0.1  # class 0 alone: its own T would all but binarise its probabilities
    got = fit_label_temperatures(torch.tensor(z), torch.tensor(y))
    pooled = minimum(z.ravel(), y.ravel())
    assert got[0] == got[1] == pytest.approx(pooled, rel=1e-4) and pooled > 0.2
    assert got[2] == pytest.approx(minimum(z[:, 2], y[:, 2]), rel=1e-4)
    assert fit_label_temperatures(torch.tensor(z[:, :1]), torch.tensor(y[:, :1])) == [1.0]  # 1 mistake: too few
    # the boundary, both sides: 4 wrong labels take the shared T, 5 their own
    from vit.deploy.label_calibration import temperature_groups

    y5 = y.copy()
    y5[1:6, 1] = 1 - (z[1:6, 1] > 0)  # class 1: 5 wrong
    _, own, takes_shared = temperature_groups(torch.tensor(z), torch.tensor(y5))
    assert own.tolist() == [False, True, True] and takes_shared.tolist() == [True, False, False]
    _, own, takes_shared = temperature_groups(torch.tensor(z), torch.tensor(y))
    assert own.tolist() == [False, False, True] and takes_shared.tolist() == [True, True, False]


def test_the_shared_temperature_needs_min_mistakes_pooled_both_sides():
    """No class with MIN_MISTAKES (5) wrong labels of its own: 3 + 2 pooled make the shared T (the minimum of the
    pooled BCE, scipy) for both; 3 + 1 pooled are too few, and every T stays 1."""
    from vit.deploy.label_calibration import MIN_MISTAKES, temperature_groups

    rng = np.random.default_rng(5)
    z = rng.normal(0, 3, (20, 3))
    z[np.abs(z) < 0.5] = 1.0  # no label on the fence: each flip below is one mistake
    y = (z > 0).astype(float)
    y[:3, 0] = 1 - y[:3, 0]  # class 0: 3 wrong
    y[3:5, 1] = 1 - y[3:5, 1]  # class 1: 2 wrong; class 2: none (no minimum, out of the pool)
    assert MIN_MISTAKES == 5
    best = minimize_scalar(lambda s: bce(z[:, :2].ravel() / np.exp(s), y[:, :2].ravel()), bounds=(-8, 5),
                           method="bounded", options={"xatol": 1e-10})
    pooled = float(np.exp(best.x))
    _, own, takes_shared = temperature_groups(torch.tensor(z), torch.tensor(y))
    assert own.tolist() == [False] * 3 and takes_shared.tolist() == [True, True, False]
    got = fit_label_temperatures(torch.tensor(z), torch.tensor(y))
    assert got[0] == got[1] == pytest.approx(pooled, rel=1e-4) and got[2] == 1.0 and abs(pooled - 1) > 0.1
    y[4, 1] = 1 - y[4, 1]  # class 1: 1 wrong, 4 in the pool
    _, own, takes_shared = temperature_groups(torch.tensor(z), torch.tensor(y))
    assert not own.any() and not takes_shared.any()
    assert fit_label_temperatures(torch.tensor(z), torch.tensor(y)) == [1.0, 1.0, 1.0]


def test_the_moved_thresholds_keep_every_images_labels_and_the_unmoved_ones_do_not():
    rng = np.random.default_rng(1)
    z = rng.normal(0, 3, (2000, 6))
    t = rng.uniform(0.05, 0.95, 6)
    temperatures = rng.uniform(0.3, 4.0, 6).tolist()
    before = [sorted(np.flatnonzero(row).tolist()) for row in expit(z) >= t]  # numpy: the labels of sigmoid(z)
    moved = moved_thresholds(t.tolist(), temperatures)
    np.testing.assert_allclose(moved, expit(logit(t) / np.array(temperatures)), rtol=1e-12)
    calibrated = Calibration(temperatures, thresholds=moved)
    assert label_sets(torch.tensor(z), t.tolist(), calibrated) == before
    assert [] in before and any(len(s) > 1 for s in before)  # images with no label ("none of these") and several
    assert label_sets(torch.tensor(z), t.tolist()) == before  # no calibration: as before
    # the other side: the probabilities change, so keeping the old cuts on them changes labels
    unmoved = Calibration(temperatures, thresholds=t.tolist())
    assert label_sets(torch.tensor(z), t.tolist(), unmoved) != before


def test_the_figures_are_the_hand_formulas_over_the_known_labels():
    logits, targets, _ = overconfident(n=500, seed=3)
    temperatures = [2.0, 0.7, 1.0, 1.3, 1.1]
    got = label_figures(logits, targets, temperatures)
    p, y = expit(logits.numpy() / np.array(temperatures)), targets.numpy()
    edges = np.linspace(0, 1, 16)
    eces = []
    for c in range(5):
        known = y[:, c] >= 0
        pc, yc = p[known, c], y[known, c]
        which = np.clip(np.digitize(pc, edges) - 1, 0, 14)  # bins [a, b), the top one closed
        eces.append(sum(abs(pc[which == b].mean() - yc[which == b].mean()) * (which == b).mean()
                        for b in range(15) if (which == b).any()))
    np.testing.assert_allclose(got["ece_per_class"], eces, atol=1e-6)
    assert got["ece"] == pytest.approx(np.mean(eces), abs=1e-6)
    known = y >= 0
    assert got["nll"] == pytest.approx(bce(logits.numpy()[known] / np.tile(temperatures, (500, 1))[known], y[known]))
    assert got["brier"] == pytest.approx(np.mean((p[known] - y[known]) ** 2))


@pytest.fixture(scope="module")
def calibrated_labels(quadrant_run, tmp_path_factory):
    """The quadrant checkpoint calibrated by `calibrate_checkpoint` (a copy), and what it printed."""
    from tests.dummies import QuadrantLabels
    from vit.deploy.calibration import calibrate_checkpoint

    root = tmp_path_factory.mktemp("calibrated_labels")
    shutil.copy(quadrant_run / "model.ckpt", root / "model.ckpt")
    printed: list[str] = []
    with pytest.raises(UserValueError, match="is multi-label, and no \"unknown\" score for a multi-label model"):
        calibrate_checkpoint(root / "model.ckpt", QuadrantLabels(), outliers=root, say=printed.append)
    assert "confidence" not in torch.load(root / "model.ckpt", weights_only=False)
    calibrate_checkpoint(root / "model.ckpt", QuadrantLabels(), figure_dir=root, say=printed.append)
    assert (root / "reliability.png").stat().st_size > 10_000
    return root / "model.ckpt", printed


def by_hand(ckpt, pixels: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The network's logits on the pixels (normalised as the 1-channel default), then numpy: sigmoid(z / T_c), and
    the labels of the uncalibrated sigmoid(z) at the checkpoint's thresholds."""
    from vit.deploy.classifier import read_classifier

    stored = torch.load(ckpt, weights_only=False)
    with torch.no_grad():
        z = read_classifier(ckpt).model((pixels.float() / 255 - 0.5) / 0.5).double().numpy()
    temperatures = np.array(stored["confidence"]["temperature"])
    return expit(z / temperatures), expit(z) >= np.array(stored["vit"]["thresholds"]), expit(z)


def test_predict_serve_onnx_and_openvino_answer_the_calibrated_probabilities_and_the_same_labels(
        calibrated_labels, quadrant_run, tmp_path):
    from tests.dummies import quadrant_pixels
    from tests.serve.conftest import client_of, make_app
    from vit.commands.predict import main as predict
    from vit.deploy import load_classifier
    from vit.deploy.classifier import read_classifier
    from vit.deploy.export import export_onnx
    from vit.serve.core import Predictor

    ckpt, printed = calibrated_labels
    assert any(line.startswith("temperature per class T_c = ") for line in printed)
    assert any("every val image's labels unchanged" in line for line in printed)
    assert any(line.startswith('no "unknown" score for a multi-label model') for line in printed)
    stored = torch.load(ckpt, weights_only=False)["confidence"]
    assert len(stored["temperature"]) == 4 and stored["threshold"] is None and stored["stats"] is None
    assert stored["report"]["after"]["ece"] < stored["report"]["before"]["ece"]
    files = sorted((quadrant_run / "images").glob("*.png"))
    pixels, _ = quadrant_pixels(len(files), seed=2)
    probs, labels, plain = by_hand(ckpt, pixels)
    assert np.abs(probs - plain).max() > 0.05  # T moved the probabilities
    clear = (np.abs(plain - np.array(torch.load(ckpt, weights_only=False)["vit"]["thresholds"])) > 1e-4).all(1)

    def table(rows: list[dict]) -> tuple[np.ndarray, list[list[int]]]:
        got = np.zeros_like(probs)
        for i, r in enumerate(rows):
            got[i, [e["class"] for e in r["top_k"]]] = [e["probability"] for e in r["top_k"]]
        return got, [sorted(e["class"] for e in r["labels"]) for r in rows]

    expected = [np.flatnonzero(row).tolist() for row in labels]
    export_onnx(read_classifier(ckpt), tmp_path / "onnx")
    onnx = tmp_path / "onnx" / "model.onnx"
    for model, backend in ((ckpt, "torch"), (onnx, "onnx"), (onnx, "openvino")):
        rows = predict(["--ckpt", str(model), *map(str, files), "--out", str(tmp_path / f"{backend}.json"),
                        "--top_k", "4", "--backend", backend])
        got, said = table(rows)
        np.testing.assert_allclose(got, probs, atol=1e-5, err_msg=backend)
        # onnxruntime's float rounding may flip a label within 1e-4 of its cut: those images are left out there
        assert [s for s, ok in zip(said, clear) if ok or backend == "torch"] == \
            [e for e, ok in zip(expected, clear) if ok or backend == "torch"], backend

    async def served(backend: str) -> list[dict]:
        from urllib.parse import unquote

        model = ckpt if backend == "torch" else onnx
        async with client_of(make_app(Predictor(load_classifier(model, backend=backend)))) as client:
            answers = [await client.post("/predict?top_k=4", files={"file": (f.name, f.read_bytes())}) for f in files]
            tasks = [await client.post("/?top_k=4", content=f.read_bytes(), headers={"Content-Type": "image/png"})
                     for f in files]
        assert all(a.status_code == 200 for a in answers + tasks)
        for a, t in zip(answers, tasks):  # the Hugging Face shape: the same list, the labels in X-Answer
            assert t.json() == [{"label": e["name"], "score": e["probability"]} for e in a.json()["top_k"]]
            said = t.headers["X-Answer"]
            assert ([unquote(n) for n in said.split(";")] if said else []) == [e["name"] for e in a.json()["labels"]]
        return [a.json() for a in answers]

    for backend in ("torch", "onnx", "openvino"):
        got, said = table(asyncio.run(served(backend)))
        np.testing.assert_allclose(got, probs, atol=1e-5, err_msg=backend)
        assert [s for s, ok in zip(said, clear) if ok or backend == "torch"] == \
            [e for e, ok in zip(expected, clear) if ok or backend == "torch"], backend


def test_an_onnx_exported_before_calibration_answers_as_before(quadrant_run, tmp_path):
    from tests.dummies import quadrant_pixels
    from vit.deploy import load_classifier
    from vit.deploy.classifier import read_classifier
    from vit.deploy.export import export_onnx
    from vit.deploy.predict import predict_files

    ckpt = quadrant_run / "model.ckpt"
    assert "confidence" not in torch.load(ckpt, weights_only=False)  # the uncalibrated fit
    export_onnx(read_classifier(ckpt), tmp_path)
    onnx = load_classifier(tmp_path / "model.onnx")
    assert onnx.calibration is None
    files = sorted((quadrant_run / "images").glob("*.png"))
    pixels, _ = quadrant_pixels(len(files), seed=2)
    with torch.no_grad():
        z = read_classifier(ckpt).model((pixels.float() / 255 - 0.5) / 0.5).double().numpy()
    for row, p in zip(predict_files(onnx, files, top_k=4), expit(z)):
        assert [e["probability"] for e in row["top_k"]] == pytest.approx(sorted(p, reverse=True), abs=1e-5)


def test_fit_on_the_multilabel_recipe_ends_by_fitting_a_temperature_per_class(tmp_path, capsys):
    from tests import load_script
    from tests.conftest import quiet_run
    from vit.commands import main

    root = load_script("multilabel_digits").write_composites(tmp_path / "data", {"train": 60, "val": 30, "test": 10})
    recipe = str(Path(__file__).parents[2] / "configs" / "multilabel_cpu.yaml")
    main(["fit", *quiet_run(tmp_path, recipe, calibrate=True), f"--data.init_args.root={root}",
          "--data.init_args.num_workers=0", "--trainer.max_epochs=2", "--test_after_fit=false",
          f"--model.init_args.model_kwargs={{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2}}"])
    lines = capsys.readouterr().out.splitlines()
    best = next((tmp_path / "ckpt").glob("best-*.ckpt"))
    assert any(line.startswith(f"calibrated {best}: vit predict and vit serve answer with a temperature per "
                               "class") for line in lines), lines[-8:]
    assert not any(line.startswith("calibration skipped") for line in lines)
    stored = torch.load(best, weights_only=False)["confidence"]
    assert len(stored["temperature"]) == 10 and len(stored["thresholds"]) == 10
    json.dumps({k: v for k, v in stored.items() if k != "stats"})  # plain data


def test_the_hub_export_of_a_calibrated_multi_label_checkpoint_states_its_temperatures(calibrated_labels, tmp_path):
    from huggingface_hub import ModelCard

    from vit.commands import main

    ckpt, _ = calibrated_labels
    main(["export", "--ckpt", str(ckpt), "--format", "hub", "--out", str(tmp_path / "hub")])
    stored = torch.load(ckpt, map_location="cpu", weights_only=False)["confidence"]  # read apart from vit
    text = ModelCard.load(tmp_path / "hub" / "README.md").text
    assert f"a temperature per class, T = {[round(t, 4) for t in stored['temperature']]}" in text
    assert "sigmoid(logit_c / T_c)" in text and "above" not in text.split("## Confidence")[1].split("##")[0]


def numpy_ece(p: np.ndarray, y: np.ndarray, bins: int = 15) -> float:
    """One class's ECE by hand: 15 equal-width bins [a, b) (the top one closed), |mean p - share positive| weighted
    by the bin's share of the labels."""
    which = np.clip(np.digitize(p, np.linspace(0, 1, bins + 1)) - 1, 0, bins - 1)
    return float(sum(abs(p[which == b].mean() - y[which == b].mean()) * (which == b).mean()
                     for b in range(bins) if (which == b).any()))


def test_the_mean_ece_leaves_out_a_class_with_no_known_label():
    """Class 3's labels are all unknown: its ECE is None and the mean is over classes 0-2 alone (dividing by all 4
    would report 3/4 of it); class 2 has known labels but no positive, and counts."""
    logits, targets, _ = overconfident(n=400, seed=5)
    logits, targets = logits[:, :4].clone(), targets[:, :4].clone()
    targets[:, 2] = 0.0  # known, no positive
    targets[:, 3] = -1.0  # nothing known
    got = label_figures(logits, targets)
    p, y = expit(logits.numpy()), targets.numpy()
    eces = [numpy_ece(p[y[:, c] >= 0, c], y[y[:, c] >= 0, c]) for c in range(3)]
    assert got["ece_per_class"][3] is None
    np.testing.assert_allclose(got["ece_per_class"][:3], eces, atol=1e-6)
    assert got["ece"] == pytest.approx(np.mean(eces), abs=1e-6)


class _Logits(torch.nn.Module):
    """A stub multi-label classifier whose "images" are its logits."""

    device = torch.device("cpu")

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.thresholds = [0.5] * classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_the_report_names_the_classes_kept_at_one_and_those_taking_the_shared_t():
    """Counted by hand: class 0 one wrong label and class 1 four (under 5: the shared T), class 2 eight (its own
    T), class 3 all positive (one outcome: no minimum, T = 1), class 4 separable at 0 (no minimum, T = 1)."""
    from vit.deploy.label_calibration import describe_labels, fit_label_confidence

    rng = np.random.default_rng(2)
    z = rng.normal(0, 3, (20, 5))
    y = (z > 0).astype(float)
    z[0, 0], y[0, 0] = -0.01, 1.0
    y[1:5, 1] = 1 - y[1:5, 1]
    y[:8, 2] = 1 - y[:8, 2]
    y[:, 3] = 1.0
    val = torch.utils.data.TensorDataset(torch.tensor(z, dtype=torch.float32), torch.tensor(y, dtype=torch.float32))
    confidence = fit_label_confidence(_Logits(5), val)
    report, t = confidence.report, confidence.calibration.temperature
    assert report["kept_at_one"] == [3, 4] and report["shared"] == [0, 1]
    assert t[3] == t[4] == 1.0 and t[0] == t[1] != 1.0 and t[2] not in (1.0, t[0])
    lines = describe_labels(confidence, ["a", "b", "c", "d", "e"])
    assert any("T_c = 1 kept for d, e:" in line for line in lines)
    assert any(line.startswith(f"  T = {t[0]:.4f} for a, b,") for line in lines)
