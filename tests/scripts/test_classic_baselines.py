"""scripts/classic_baselines.py reads a split folder's real pixels, chooses on val and scores on test."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.svm import SVC

from tests import load_script


@pytest.fixture(scope="module")
def tiny_digits(tmp_path_factory):
    """250 of scikit-learn's 8x8 digits, split by small_folders' own writer."""
    from sklearn.datasets import load_digits

    data = load_digits()
    keep = np.arange(250)
    images = np.round(data.images[keep] * 255 / 16).astype(np.uint8)
    root = tmp_path_factory.mktemp("digits")
    load_script("small_folders").write_split_folder(root, images, data.target[keep], [str(i) for i in range(10)])
    return root, images, data.target[keep]


def test_the_pixels_are_the_folders_images_scaled_to_one(tiny_digits):
    root, images, labels = tiny_digits
    data = load_script("classic_baselines").load_folder(root)
    x_test, y_test = data["test"]
    assert sum(len(data[s][1]) for s in ("train", "val", "test")) == len(labels)
    # loaded class by class, names sorted; each file is named by its index among the kept digits
    files = [p for c in sorted(str(i) for i in range(10)) for p in sorted((root / "test" / c).glob("*.png"))]
    assert x_test.shape == (len(files), 64)
    for x, y, path in zip(x_test, y_test, files):
        assert np.array_equal(x * 255, images[int(path.stem)].ravel()) and y == labels[int(path.stem)]


def test_choices_come_from_val_and_the_score_from_test(tiny_digits, tmp_path):
    root, _, _ = tiny_digits
    script = load_script("classic_baselines")
    out = tmp_path / "b.json"
    results = script.main([str(root), "--json", str(out)])[root.name]
    assert json.loads(out.read_text())[root.name] == results
    data = script.load_folder(root)
    (x_train, y_train), (x_val, y_val), (x_test, y_test) = (data[s] for s in ("train", "val", "test"))
    # an independent grid search over the same settings, by val accuracy
    scale = 1.0 / (x_train.shape[1] * x_train.var())
    vals = [SVC(C=c, gamma=g * scale).fit(x_train, y_train).score(x_val, y_val)
            for c in script.SVM_C for g in script.SVM_GAMMA]
    svm = results["svm"]
    assert svm["val"] == pytest.approx(max(vals))
    assert svm["test"] == pytest.approx(SVC(**svm["params"]).fit(x_train, y_train).score(x_test, y_test))
    assert svm["params"]["C"] in script.SVM_C and results["knn"]["params"]["n_neighbors"] in script.NEIGHBOURS
    assert results["images"] == {"train": len(y_train), "val": len(y_val), "test": len(y_test)}


def test_the_setting_with_the_best_val_accuracy_is_scored_on_test():
    """A stand-in model whose val and test scores are set by its setting: the choice reads val, never test."""
    script = load_script("classic_baselines")
    splits = {name: (np.full((2, 1), i), np.zeros(2)) for i, name in enumerate(("train", "val", "test"))}

    class Model:
        def __init__(self, val: float, test: float) -> None:
            self.scores = {1: val, 2: test}

        def fit(self, x, y):
            assert x[0, 0] == 0  # fitted on train
            return self

        def score(self, x, y):
            return self.scores[int(x[0, 0])]

    grid = [{"val": 0.5, "test": 0.9}, {"val": 0.8, "test": 0.6}, {"val": 0.8, "test": 0.1}, {"val": 0.7, "test": 1.0}]
    assert script.choose(Model, grid, splits) == {"params": grid[1], "val": 0.8, "test": 0.6}
