"""Fitting the temperature, the unknown score and its threshold (`vit.deploy.calibration`) against independent
computations (scipy, numpy, brute force), and its short messages."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax, softmax

from tests.deploy.test_confidence import by_hand, images
from vit.commands import run
from vit.deploy.calibration import (
    HALF_TOLERANCE,
    calibrate_checkpoint,
    calibration_figures,
    fit_temperature,
    fit_unknown,
    in_half,
    reliability_bins,
    sample,
    threshold_at,
)
from vit.deploy.confidence import UnknownScore, calibrated_probabilities, decisions
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


def test_a_val_split_classified_all_right_keeps_t_at_1():
    """Every image right: the NLL falls as T -> 0 with no minimum, and a tiny T would wreck the next mistake."""
    logits, _ = overconfident()
    right = logits.argmax(1)
    assert fit_temperature(logits, right) == 1.0
    wrong_once = right.clone()
    wrong_once[0] = (right[0] + 1) % 5
    assert 0.05 < fit_temperature(logits, wrong_once) < 20  # one mistake: a minimum exists again


def test_calibrating_without_a_validation_split_says_so(fitted):
    ckpt = next((fitted / "ckpt").glob("best-*.ckpt"))
    splits = {"class_names": ["a"], "train_set": [0], "test_set": None, "num_workers": 0, "eval_split": print}
    for val in (None, []):  # none, or an empty one
        with pytest.raises(UserValueError, match="has no validation split") as error:
            calibrate_checkpoint(ckpt, SimpleNamespace(val_set=val, **splits))
        assert "val_fraction" in str(error.value) and len(str(error.value).splitlines()) == 1


def test_calibrating_on_data_that_is_no_image_datamodule_names_what_it_lacks(fitted):
    ckpt = next((fitted / "ckpt").glob("best-*.ckpt"))
    with pytest.raises(UserValueError, match=r"the data \(SimpleNamespace\) is not an image DataModule .*num_workers"):
        calibrate_checkpoint(ckpt, SimpleNamespace(val_set=[1], test_set=None))


def test_an_outlier_folder_sets_the_best_separating_threshold(fitted, tmp_path):
    from vit.data import Digits
    from vit.deploy.calibration import threshold_between

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
    assert (tmp_path / "reliability.png").stat().st_size > 10_000  # drawn beside the checkpoint
    _, outlier_scores, stored = by_hand(ckpt, sorted(folder.glob("*.png")))
    assert stored["threshold"] == confidence.calibration.threshold
    assert (outlier_scores > stored["threshold"]).mean() >= 0.5


def test_the_acceptance_stored_with_outliers_is_the_share_predict_accepts(fitted, tmp_path, monkeypatch):
    """Outliers scoring far above every val image: the best threshold is the highest val score, and `vit predict`
    (which rejects only scores above it) accepts every val image: the stored acceptance is 1, not 1 - 1/N."""
    import vit.deploy.calibration as calibration
    from vit.data import Digits
    from vit.deploy.classifier import read_classifier
    from vit.deploy.confidence import decisions

    data = Digits(img_size=16)
    data.setup("fit")
    classifier = read_classifier(next((fitted / "ckpt").glob("best-*.ckpt")))
    monkeypatch.setattr(calibration, "folder_scores", lambda *args: torch.tensor([1e9]))
    confidence = calibration.fit_confidence(classifier, data.eval_split("train"), data.eval_split("val"),
                                            outliers=tmp_path)
    features, _, _ = calibration.split_outputs(classifier, data.eval_split("val"), "val")
    val_scores = confidence.unknown(features)[0]
    accepted = 1 - np.mean(decisions(val_scores, confidence.calibration))
    assert confidence.calibration.threshold == pytest.approx(float(val_scores.max()))
    assert confidence.calibration.acceptance == accepted == 1.0


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


@pytest.mark.parametrize("size", [5, 6])
def test_a_split_past_the_cap_is_a_seeded_sample_and_one_at_it_is_whole(size):
    dataset = torch.utils.data.TensorDataset(torch.arange(size))
    kept = sample(dataset, limit=5, seed=3)
    if size == 5:
        assert kept is dataset
    else:
        indices = kept.indices
        assert len(indices) == 5 and indices == sorted(set(indices)) and set(indices) <= set(range(size))
        assert indices == sample(dataset, limit=5, seed=3).indices  # the same images every time


def test_calibration_reads_the_file_once_and_at_most_the_cap_of_each_split(fitted, tmp_path, monkeypatch):
    import vit.checkpoints.io
    from vit.data import Digits

    ckpt = tmp_path / "c.ckpt"
    shutil.copy(next((fitted / "ckpt").glob("best-*.ckpt")), ckpt)
    data = Digits(img_size=16)
    data.setup("fit")
    monkeypatch.setattr("vit.deploy.calibration.MAX_SPLIT_IMAGES", 300)
    calls = []  # every read and write of a checkpoint file, wherever it is imported from
    for name in ("read_checkpoint", "save_checkpoint"):
        real = getattr(vit.checkpoints.io, name)
        counted = lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k)
        for module in ("vit.checkpoints.io", "vit.deploy.calibration", "vit.deploy.classifier"):
            monkeypatch.setattr(f"{module}.{name}", counted, raising=False)
    said = []
    confidence = calibrate_checkpoint(ckpt, data, layers="pooled", say=said.append)
    assert calls == ["read_checkpoint", "save_checkpoint"]  # once each (`vit fit --calibrate` read it three times)
    train, val = len(data.eval_split("train")), len(data.eval_split("val"))
    assert val < 300 < train
    assert confidence.report["train_images"] == 300 and confidence.report["val_images"] == val
    assert f"calibration reads a seeded 300 of the {train:,} training images" in said


def test_float16_statistics_where_they_keep_every_val_answer():
    rng = np.random.default_rng(2)
    features, labels = rng.normal(size=(300, 8)) + np.repeat(np.eye(3, 8) * 3, 100, 0), np.repeat(np.arange(3), 100)
    unknown = fit_unknown(torch.tensor(features), torch.tensor(labels), 3)
    val = [torch.tensor(rng.normal(size=(200, 8)) * 2)]
    half_score, half = in_half(unknown, val)
    assert half
    stored = half_score.state(half=True)["layers"][0]
    assert stored["means"].dtype == stored["whiten"].dtype == torch.float16
    full_bytes = sum(t.numel() * t.element_size() for t in unknown.state()["layers"][0].values())
    assert sum(t.numel() * t.element_size() for t in stored.values()) == full_bytes // 2
    # the distance by hand from the stored float16 numbers: P = L L'
    m, w = stored["means"].double().numpy(), stored["whiten"].double().numpy()
    q = val[0].numpy() / np.linalg.norm(val[0].numpy(), axis=1, keepdims=True)
    by_numpy = np.stack([np.einsum("nd,de,ne->n", q - c, w @ w.T, q - c) for c in m], 1).min(1)
    reloaded = UnknownScore.from_state(half_score.state(half=True))
    np.testing.assert_allclose(reloaded(val)[0].numpy(), by_numpy, rtol=1e-4, atol=1e-4)
    full = unknown(val)[0].double()
    assert float((reloaded(val)[0].double() - full).abs().max()) <= HALF_TOLERANCE * float(full.std())
    # val images whose scores all but coincide: rounding moves them by more than their spread, so float32 stays
    tight = [torch.tensor(np.repeat(rng.normal(size=(1, 8)), 50, 0) + rng.normal(size=(50, 8)) * 1e-7)]
    kept, half = in_half(unknown, tight)
    assert not half and kept is unknown
    assert unknown.state()["layers"][0]["precision"].dtype == torch.float32


@pytest.mark.parametrize("temperature", [1.0, 0.25])
def test_reliability_bins_give_torchmetrics_ece(temperature):
    from torchmetrics.classification import MulticlassCalibrationError

    logits, labels = overconfident()
    bins = reliability_bins(logits, labels, temperature)
    assert sum(bins["count"]) == len(labels) and min(bins["count"]) > 0
    ece = sum(n / len(labels) * abs(a - c) for n, a, c in zip(bins["count"], bins["accuracy"], bins["confidence"]))
    probs = (logits / temperature).softmax(-1).float()
    expected = float(MulticlassCalibrationError(num_classes=5, n_bins=15, norm="l1")(probs, labels))
    assert ece == pytest.approx(expected, abs=1e-6)
    top = probs.max(-1).values.double()
    assert bins["confidence"][-1] == pytest.approx(top[top >= 14 / 15].mean().item())  # the last bin by hand


def test_a_covariance_per_class_matches_numpy_and_survives_a_class_of_one():
    rng = np.random.default_rng(3)
    labels = np.r_[np.repeat(np.arange(3), 60), 3]  # class 3 has one image: its own covariance is 0
    scales = np.array([0.5, 1.0, 2.0, 1.0])[labels, None]
    features = rng.normal(size=(181, 6)) * scales + np.eye(4, 6)[labels] * 4
    unknown = fit_unknown(torch.tensor(features), torch.tensor(labels), 4, per_class=True)
    z = features / np.linalg.norm(features, axis=1, keepdims=True)
    means = np.stack([z[labels == c].mean(0) for c in range(4)])
    shared = np.cov(z - means[labels], rowvar=False, bias=True)
    shared = 0.999 * shared + 0.001 * np.trace(shared) / 6 * np.eye(6)
    own = [np.atleast_2d(np.cov(z[labels == c] - means[c], rowvar=False, bias=True)) if c < 3 else np.zeros((6, 6))
           for c in range(4)]
    precisions = [np.linalg.inv(0.9 * o + 0.1 * shared) for o in own]  # each class shrunk 10% towards the shared
    queries = rng.normal(size=(30, 6)) * 2
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    d = np.stack([np.einsum("nd,de,ne->n", q - m, p, q - m) for m, p in zip(means, precisions)], 1)
    score, nearest = unknown(torch.tensor(queries, dtype=torch.float32))
    np.testing.assert_allclose(score.numpy(), d.min(1), rtol=1e-4, atol=1e-3)
    assert nearest.tolist() == d.argmin(1).tolist()
    # stored in float16 (whitening factors per class) and read back: the same distances within float16's digits
    reloaded = UnknownScore.from_state(unknown.state(half=True))
    assert reloaded.layers[0].whiten.shape == (4, 6, 6)
    np.testing.assert_allclose(reloaded(torch.tensor(queries))[0].numpy(), d.min(1), rtol=1e-2)


def test_covariance_shared_on_request_is_one_pooled_covariance_where_one_per_class_would_fit(fitted, tmp_path):
    """`--covariance shared` is honoured where "auto" would take one covariance per class (10 classes, 32 wide):
    the stored precision is the inverse of numpy's pooled within-class covariance of the training images' pooled
    features (L2-normalised, shrunk 0.1% towards the identity)."""
    from vit.checkpoints.io import read_checkpoint
    from vit.data import Digits
    from vit.deploy.calibration import per_class_fits
    from vit.deploy.classifier import read_classifier

    ckpt = tmp_path / "c.ckpt"
    shutil.copy(next((fitted / "ckpt").glob("best-*.ckpt")), ckpt)
    data = Digits(img_size=16)
    data.setup("fit")
    calibrate_checkpoint(ckpt, data, layers="pooled", covariance="shared", say=lambda line: None)
    layer = read_checkpoint(ckpt)["confidence"]["stats"]["layers"][0]
    model = read_classifier(ckpt).model
    assert per_class_fits(10, [model.embed_dim])  # "auto" would have taken one per class
    train = data.eval_split("train")
    images, labels = zip(*(train[i] for i in range(len(train))))
    x, labels = torch.stack(images), np.array(labels)
    with torch.no_grad():
        features = model.forward_head(model.forward_features(x), pre_logits=True).double().numpy()
    z = features / np.linalg.norm(features, axis=1, keepdims=True)
    means = np.stack([z[labels == c].mean(0) for c in range(10)])
    pooled = np.cov(z - means[labels], rowvar=False, bias=True)
    want = np.linalg.inv(0.999 * pooled + 0.001 * np.trace(pooled) / len(pooled) * np.eye(len(pooled)))
    if "whiten" in layer:  # float16 statistics: the whitening factor L of P = L L'
        got, digits = layer["whiten"].double().numpy() @ layer["whiten"].double().numpy().T, 1e-2
    else:
        got, digits = layer["precision"].double().numpy(), 1e-5  # float32: 3e-8 measured
    assert got.shape == want.shape == (model.embed_dim, model.embed_dim)  # one, shared: not one per class
    np.testing.assert_allclose(layer["means"].double().numpy(), means, atol=2e-3)
    assert np.linalg.norm(got - want) <= digits * np.linalg.norm(want)


@pytest.mark.parametrize("classes, widths, fits", [
    (5, [96] * 5, True),  # scratch_small's ViT (4 blocks + pooled, dim 96): 2*5*5*96^2 = 0.46 MB
    (3, [384] * 13, False),  # ViT-S/16 with 3 classes: 2*3*13*384^2 = 11.5 MB, past a LoRA checkpoint's 8 MB bar
    (1000, [96] * 5, False),
])
def test_a_covariance_per_class_only_within_its_byte_budget(classes, widths, fits):
    from vit.deploy.calibration import per_class_fits

    assert per_class_fits(classes, widths) is fits
    widths = [384] * 13  # ViT-S/16: 12 blocks and the pooled features
    needed = 2 * 5 * 13 * 384 * 384  # float16 bytes for 5 classes
    assert per_class_fits(5, widths, budget=needed) and not per_class_fits(5, widths, budget=needed - 1)


@pytest.mark.parametrize("per_class", [False, True])
def test_one_training_image_a_class_still_gives_a_score(per_class):
    # every centred feature is 0, so the covariance is 0: the shrinkage target must not be scaled by its trace
    features = torch.tensor(np.random.default_rng(4).normal(size=(3, 5)))
    unknown = fit_unknown(features, torch.arange(3), 3, per_class=per_class)
    z = features.numpy() / np.linalg.norm(features.numpy(), axis=1, keepdims=True)
    queries = torch.tensor(np.random.default_rng(5).normal(size=(4, 5)))
    q = queries.numpy() / np.linalg.norm(queries.numpy(), axis=1, keepdims=True)
    # P = (0.001 I)^-1 = 1000 I (shared), or (0.1 x 0.001 I)^-1 per class: a scaled squared Euclidean distance
    scale = 1000.0 if not per_class else 10000.0
    expected = scale * ((q[:, None] - z[None]) ** 2).sum(-1).min(1)
    np.testing.assert_allclose(unknown(queries)[0].numpy(), expected, rtol=1e-4)


def test_a_covariance_per_class_of_wide_features_fits_on_two_threads():
    # torch 2.14.1's batched LU hung here (MKL at 2 threads); a subprocess turns a hang into a failure
    import subprocess
    import sys

    code = ("import torch; torch.set_num_threads(2); torch.manual_seed(0)\n"
            "from vit.deploy.calibration import fit_layer\n"
            "x, y = torch.randn(400, 192), torch.arange(400) % 10\n"
            "score = fit_layer(x, y, 10, per_class=True)\n"
            "print(score.precision.shape)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "torch.Size([10, 192, 192])" in done.stdout, done.stderr[-500:]
