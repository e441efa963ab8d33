"""vit.probe: the logistic regression and kNN on frozen features, C and k chosen on val, the head folded into a
Linear layer, and the split features through the shared cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import tiny_vit
from tests.test_features import digits_set
from vit.probe import fit_logistic, fit_probes, folded_head, probe_state_dict, split_features

# Made-up features on which val and test prefer different C and k (seed 10 of `made_up_features`, checked
# in the tests that use them): a probe that chooses on test reports other C and k than one that chooses on val.
C_GRID, K_GRID = (0.001, 0.01, 0.1, 1.0, 10.0), (1, 3, 5, 10, 20)


def made_up_features(seed: int = 10, dim: int = 32) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Three overlapping Gaussian classes: 60 train, 45 val and 45 test (features float32-exact, labels)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 0.35, (3, dim))
    splits = {}
    for split, per_class in (("train", 20), ("val", 15), ("test", 15)):
        y = np.repeat(np.arange(3), per_class)
        splits[split] = ((means[y] + rng.normal(0, 1, (len(y), dim))).astype(np.float32).astype(np.float64), y)
    return splits


def best_on(scores: dict, smaller_first: bool) -> float:
    """The grid value of the highest score; ties go to the smaller value (C) or the larger one (k)."""
    return min(scores, key=lambda v: (-scores[v], v if smaller_first else -v))


def sklearn_choices(features: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, dict]:
    """Independently, with sklearn: top-1 on val and on test of every C (cold fits) and every k of the grids, and
    the C and k that val and that test would choose. Checks the premise: val and test choose differently, and
    val's C wins by more than a fit's rounding could flip."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    (x_train, y_train), val, test = features["train"], features["val"], features["test"]
    lr, knn = {}, {}
    with threadpool_limits(1, user_api="blas"):
        scaler = StandardScaler().fit(x_train)
        for c in C_GRID:
            clf = LogisticRegression(C=c, max_iter=5000, tol=1e-8).fit(scaler.transform(x_train), y_train)
            lr[c] = [np.mean(clf.predict(scaler.transform(x)) == y) for x, y in (val, test)]
        for k in K_GRID:
            neighbours = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute").fit(x_train, y_train)
            knn[k] = [np.mean(neighbours.predict(x) == y) for x, y in (val, test)]
    val_c, test_c = (best_on({c: scores[i] for c, scores in lr.items()}, True) for i in (0, 1))
    val_k, test_k = (best_on({k: scores[i] for k, scores in knn.items()}, False) for i in (0, 1))
    assert val_c != test_c and val_k != test_k, (lr, knn)
    assert lr[val_c][0] - max(v for c, (v, _) in lr.items() if c != val_c) >= 2 / len(val[1]), lr
    return {"lr": lr, "knn": knn, "val_c": val_c, "val_k": val_k}


def test_fit_probes_chooses_C_and_k_on_val_and_scores_test_once(monkeypatch):
    """Fails if the test split takes any part in choosing C or k: on these features val and test disagree."""
    import vit.probe

    features = made_up_features()
    expected = sklearn_choices(features)
    seen = []
    for name in ("fit_logistic", "fit_knn"):
        original = getattr(vit.probe, name)
        spy = lambda train, chooser, grid, original=original: (seen.append((train, chooser)),
                                                               original(train, chooser, grid))[1]
        monkeypatch.setattr(vit.probe, name, spy)
    probes = fit_probes(features["train"], features["val"], features["test"], c_grid=C_GRID, k_grid=K_GRID)
    val_c, val_k, val, test = expected["val_c"], expected["val_k"], features["val"], features["test"]
    assert (probes.C, probes.k) == (val_c, val_k)
    assert probes.logistic_val_acc == pytest.approx(expected["lr"][val_c][0], abs=1.01 / len(val[1]))
    assert probes.logistic_test_acc == pytest.approx(expected["lr"][val_c][1], abs=1.01 / len(test[1]))
    assert (probes.knn_val_acc, probes.knn_test_acc) == pytest.approx(expected["knn"][val_k])
    results = probes.results()
    assert results["held_out_test"] is True and results["logistic_C"] == val_c and results["knn_k"] == val_k
    assert len(seen) == 2  # both choices saw train and val, never a test feature or label
    for train, chooser in seen:
        np.testing.assert_array_equal(train[0], features["train"][0])
        np.testing.assert_array_equal(chooser[0], val[0])
        np.testing.assert_array_equal(chooser[1], val[1])


def test_fit_probes_without_a_test_split_and_with_more_neighbours_than_images():
    features = made_up_features()
    train = (features["train"][0][::10], features["train"][1][::10])  # 6 images, 2 of each class
    probes = fit_probes(train, features["val"], None, c_grid=[1.0], k_grid=[1, 50])
    assert probes.logistic_test_acc is None and probes.knn_test_acc is None
    assert probes.results()["held_out_test"] is False
    assert probes.ks == {1, 6} and probes.k in (1, 6)  # 50 neighbours of 6 training images: 6


@pytest.mark.parametrize("num_classes, trained", [(2, 2), (4, 3)])
def test_folded_head_gives_sklearn_probabilities(num_classes, trained):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    x = rng.normal(3.0, [0.1, 5.0, 1.0, 20.0], (200, 4))  # scales far from 1: the scaler matters
    y = rng.integers(0, trained, 200)  # classes from `trained` on have no training images
    scaler = StandardScaler().fit(x)
    with threadpool_limits(1, user_api="blas"):  # small matrices: BLAS threads only cost time
        clf = LogisticRegression(C=0.5).fit(scaler.transform(x), y)
    weight, bias = folded_head(scaler, clf, num_classes)
    assert weight.shape == (num_classes, 4)
    probs = torch.softmax(torch.tensor(x, dtype=torch.float32) @ weight.T + bias, dim=-1).double()
    expected = clf.predict_proba(scaler.transform(x))
    torch.testing.assert_close(probs[:, :trained], torch.tensor(expected), atol=1e-5, rtol=0)
    assert (probs[:, trained:] < 1e-6).all()


def test_a_feature_that_barely_varies_keeps_the_float32_head_exact():
    """A random model's cls token hardly varies between images (std 1e-5 against 1 for the rest): standardised,
    its weight in the folded float32 head became 1e5, and the head's logits lost 0.01-0.05 to cancellation, so
    the checkpoint and the probe disagreed on near-ties (seen on an AMD CPU). The logits must stay the probe's."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 1.0, (60, 8))
    x[:, 0] = 2.5 + rng.normal(0, 1e-6, 60)  # the near-constant feature, far from 0
    y = (x[:, 1] + x[:, 2] > 0).astype(int) + (x[:, 3] > 1)
    scaler, clf, _, _ = fit_logistic((x[:40], y[:40]), (x[40:], y[40:]), [1.0])
    weight, bias = folded_head(scaler, clf, 3)
    logits = torch.tensor(x, dtype=torch.float32) @ weight.T + bias
    expected = clf.decision_function(scaler.transform(x))  # float64, the probe's own scores
    assert (logits.double() - torch.tensor(expected)).abs().max() < 1e-3


def test_probe_state_dict_puts_the_head_in_place_and_in_both_heads_of_a_distilled_model():
    head = (torch.ones(3, 2), torch.zeros(3))
    plain = probe_state_dict({"blocks.0.w": torch.ones(1), "head.weight": torch.zeros(5, 2)}, head)
    assert set(plain) == {"blocks.0.w", "head.weight", "head.bias"} and plain["head.weight"] is head[0]
    distilled = probe_state_dict({"head.weight": torch.zeros(5, 2), "head_dist.weight": torch.zeros(5, 2)}, head)
    assert distilled["head_dist.weight"] is head[0] and distilled["head_dist.bias"] is head[1]


def test_split_features_go_through_the_cache_as_float64(tmp_path):
    from vit.features import weights_key

    model, data = tiny_vit(depth=1, num_classes=3), digits_set()
    x, y, how = split_features(model, data, "val", weights=weights_key(model, {}), cache_dir=tmp_path, batch_size=5)
    assert x.dtype == np.float64 and x.shape == (12, 32) and how.startswith("extracted, cached in")
    np.testing.assert_array_equal(y, data.labels.numpy())
    again = split_features(model, data, "val", weights=weights_key(model, {}), cache_dir=tmp_path)
    assert again[2].startswith("loaded from cache") and np.array_equal(again[0], x)
    assert split_features(model, data, "val", weights="w", cache_dir=None)[2] == "extracted"
