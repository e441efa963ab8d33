"""scripts/experiments/parity.py and scripts/experiments/small_folders.py run end to end at a reduced size: every arm
trains.

The accuracy figures themselves live in the README (seed-sensitive and minutes long: no timed test)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests import load_script


@pytest.fixture(scope="module")
def tiny_digits(tmp_path_factory) -> Path:
    """3 digit classes, 8x8 PNGs in train/val/test, written by small_folders' own writer."""
    from sklearn.datasets import load_digits

    folders = load_script("small_folders")
    data = load_digits()
    keep = np.flatnonzero(data.target < 3)[:60]
    images = np.round(data.images[keep] * 255 / 16).astype(np.uint8)
    return folders.write_split_folder(tmp_path_factory.mktemp("digits"), images, data.target[keep], ["0", "1", "2"])


def test_small_folders_writes_split_class_folders_of_the_real_pixels(tiny_digits):
    counts = {s: sorted(p.parent.name for p in (tiny_digits / s).rglob("*.png")) for s in ("train", "val", "test")}
    assert all(counts.values()) and sum(map(len, counts.values())) == 60
    assert all(set(v) == {"0", "1", "2"} for v in counts.values())  # stratified: every class in every split
    names = [p.name for s in counts for p in (tiny_digits / s).rglob("*.png")]
    assert len(set(names)) == 60  # no image in two splits
    from sklearn.datasets import load_digits

    data = load_digits()
    first = next((tiny_digits / "train").rglob("*.png"))  # named by its index among the 60 kept
    pixels = np.asarray(Image.open(first))
    expected = np.round(data.images[np.flatnonzero(data.target < 3)[int(first.stem)]] * 255 / 16)
    assert pixels.shape == (8, 8) and np.array_equal(pixels, expected)


def test_tiles_of_train_and_test_share_no_pixel():
    folders = load_script("small_folders")
    (x0, x1), (t0, t1) = folders.BANDS["train"], folders.BANDS["test"]
    assert x1 <= t0 and x1 - x0 >= folders.TILE and t1 - t0 >= folders.TILE
    photo = np.arange(folders.SIDE * folders.SIDE).reshape(folders.SIDE, folders.SIDE)  # every pixel unique
    train = {int(v) for tile in folders.band_tiles(photo, x0, x1) for v in tile.ravel()}
    test = {int(v) for tile in folders.band_tiles(photo, t0, t1) for v in tile.ravel()}
    assert train and test and not train & test


@pytest.mark.slow
def test_every_arm_trains_on_a_tiny_folder(tiny_digits, tmp_path):
    parity = load_script("parity")
    out = tmp_path / "parity.json"
    results = parity.main([str(tiny_digits), "--seeds", "1", "--epochs", "1", "--workers", "0", "--threads", "1",
                           "--json", str(out)])
    arms = results[tiny_digits.name]
    assert set(arms) == set(parity.ARMS) and json.loads(out.read_text()) == results
    n_train = sum(1 for _ in (tiny_digits / "train").rglob("*.png"))
    n_test = sum(1 for _ in (tiny_digits / "test").rglob("*.png"))
    for arm, summary in arms.items():
        (run,) = summary["runs"]
        assert 0 <= run["acc"] <= 1 and abs(run["acc"] * n_test - round(run["acc"] * n_test)) < 1e-3, arm
    # the training arms really ran every step of the epoch (the loop keeps a last partial batch)
    assert arms["loop"]["runs"][0]["steps"] == math.ceil(n_train / parity.BATCH)
    assert arms["parity"]["runs"][0]["steps"] == max(1, n_train // parity.BATCH)
    assert arms["recipe"]["runs"][0]["steps"] >= 1


def test_photo_folders_split_mnist_by_digit_into_64px_rgb_class_folders(tmp_path):
    """photos017 holds the zeros, ones and sevens, mnist_other the rest: disjoint, unsplit, 64x64 RGB."""
    import gzip

    folders = load_script("small_folders")
    rng = np.random.default_rng(0)
    labels = np.array([0, 1, 7, 2, 9, 7, 3, 0])
    pixels = rng.integers(0, 256, (len(labels), 784))
    csv = tmp_path / "mnist.csv.gz"
    with gzip.open(csv, "wt") as f:
        np.savetxt(f, np.column_stack([pixels, labels]), delimiter=",", fmt="%d")
    folders.main([str(tmp_path / "out"), "--only", "photos017", "mnist_other", "--mnist_csv", str(csv)])
    photos, other = tmp_path / "out" / "photos017", tmp_path / "out" / "mnist_other"
    kept = {int(p.stem): int(p.parent.name) for p in photos.rglob("*.png")}
    rest = {int(p.stem): int(p.parent.name) for p in other.rglob("*.png")}
    assert kept == {0: 0, 1: 1, 2: 7, 5: 7, 7: 0} and rest == {3: 2, 4: 9, 6: 3}
    assert not (photos / "train").exists()  # a user's folder: ImageFolder splits it
    image = Image.open(photos / "7" / "00005.png")
    expected = Image.fromarray(pixels[5].reshape(28, 28).astype(np.uint8)).resize((64, 64), Image.BILINEAR)
    assert image.mode == "RGB" and np.array_equal(np.asarray(image)[..., 1], np.asarray(expected))


def test_a_pixel_arm_takes_the_setting_best_on_val_and_scores_it_on_test():
    """A stand-in model whose val and test scores are set by its setting: the choice reads val, never test."""
    parity = load_script("parity")
    splits = [(np.full((2, 1), i), np.zeros(2)) for i in range(3)]  # train, val, test told apart by value

    class Model:
        def __init__(self, val: float, test: float) -> None:
            self.scores = {1: val, 2: test}

        def fit(self, x, y):
            assert x[0, 0] == 0  # fitted on train
            return self

        def score(self, x, y):
            return self.scores[int(x[0, 0])]

    grid = [{"val": 0.5, "test": 0.9}, {"val": 0.8, "test": 0.6}, {"val": 0.8, "test": 0.1}, {"val": 0.7, "test": 1.0}]
    assert parity.choose(Model, grid, splits) == {"acc": 0.6, "params": grid[1], "val": 0.8}


def test_the_svm_arm_is_an_svm_on_the_folders_pixels(tiny_digits):
    """Against scikit-learn's SVC fitted here on the digits' own pixels with the arm's chosen setting."""
    from sklearn.svm import SVC

    parity = load_script("parity")
    run = parity.pixel_arm("svm", tiny_digits)
    pixels = {}
    for split in ("train", "val", "test"):
        files = sorted((tiny_digits / split).rglob("*.png"), key=lambda p: (p.parent.name, p.name))
        pixels[split] = (np.stack([np.asarray(Image.open(f), dtype=np.float64).ravel() for f in files]),
                         np.array([int(f.parent.name) for f in files]))
    (xtr, ytr), (xva, yva), (xte, yte) = pixels.values()
    scale = 1.0 / (xtr.shape[1] * xtr.var())
    grid = [{"C": c, "gamma": g * scale} for c in parity.SVM_C for g in parity.SVM_GAMMA]
    val = [SVC(**params).fit(xtr, ytr).score(xva, yva) for params in grid]
    expected = grid[val.index(max(val))]  # the first setting best on val
    assert run["params"]["C"] == expected["C"] and run["params"]["gamma"] == pytest.approx(expected["gamma"])
    model = SVC(**run["params"]).fit(xtr, ytr)
    assert run["val"] == pytest.approx(model.score(xva, yva)) and run["acc"] == pytest.approx(model.score(xte, yte))
    knn = parity.pixel_arm("knn", tiny_digits)
    assert knn["params"]["n_neighbors"] in parity.NEIGHBOURS and 0 < knn["acc"] <= 1
