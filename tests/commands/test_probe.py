"""`vit probe`: frozen features, cached; logistic regression and kNN; a linear-probe checkpoint that
`vit predict` and `vit attention` read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests import CONFIGS
from tests.conftest import subprocess_env
from vit.commands import main, run
from vit.commands.probe import folded_head

CLASSES = ("red", "green", "blue")


def noisy_colour_folder(root: Path, per_class: int = 24, size: int = 32) -> Path:
    """root/<colour>/<i>.png: noise over a faint tint of the class's channel, so that a random-init ViT's
    features separate the classes well but not perfectly."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.normal(128, 60, (size, size, 3))
            pixels[..., c] += 6
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(root / name / f"{i}.png")
    return root


def tiny_probe_args(root: Path, tmp_path: Path) -> list[str]:
    """`vit probe` on a folder with a one-block ViT of width 32 (random init), without a config file."""
    return [
        "probe", "--model", "vit.tasks.ImageClassifier", "--model.init_args.model", "vit_tiny_patch16_224",
        "--model.init_args.model_kwargs", "{depth: 1, embed_dim: 32, num_heads: 2, patch_size: 8}",
        "--data", "vit.data.ImageFolder", "--data.root", str(root), "--data.img_size", "32",
        "--data.num_workers", "0", "--data.val_fraction", "0.25", "--data.test_fraction", "0.25",
        "--seed_everything", "0", "--cache_dir", str(tmp_path / "cache"), "--out", str(tmp_path / "probe.ckpt"),
        "--C", "0.01", "0.1", "1", "--k", "1", "5",
    ]


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


def test_probe_on_a_folder_caches_features_and_its_checkpoint_predicts_the_same(tmp_path, capsys):
    from vit.data import ImageFolder

    root = noisy_colour_folder(tmp_path / "images")
    first = run(tiny_probe_args(root, tmp_path))
    out = capsys.readouterr().out
    assert out.count("extracted, cached in") == 3 and "loaded from cache" not in out
    assert re.search(r"logistic regression \(C=\S+, chosen on val from 0.01, 0.1, 1.0\): val top-1 [\d.]+, test", out)
    assert re.search(r"cosine kNN \(k=\d, chosen on val from 1, 5\)", out)
    assert 0.45 < first["logistic_test_acc"] < 1.0  # a real problem: better than chance (1/3), not trivial

    again = run(tiny_probe_args(root, tmp_path))
    out = capsys.readouterr().out
    assert out.count("loaded from cache") == 3 and "extracted" not in out
    assert again == first

    # `vit predict` on the test files, from the checkpoint alone, scores what the probe printed.
    data = ImageFolder(str(root), val_fraction=0.25, test_fraction=0.25, num_workers=0)
    data.setup("fit")
    files = [path for path, _ in data.test_set.samples]
    labels = [data.class_names[label] for _, label in data.test_set.samples]
    rows = run(["predict", "--ckpt", first["checkpoint"], *files, "--out", str(tmp_path / "p.csv"), "--top_k", "1"])
    assert [Path(r["path"]) for r in rows] == [Path(f) for f in files]
    predicted_right = np.mean([r["classes"][0] == label for r, label in zip(rows, labels)])
    assert predicted_right == pytest.approx(first["logistic_test_acc"], abs=1e-9)

    main(["attention", "--ckpt", first["checkpoint"], files[0], "--out", str(tmp_path / "maps"), "--layer", "0"])
    assert (tmp_path / "maps" / "predictions.json").is_file()

    # A changed file changes its split's key: only that split is extracted again.
    changed = Path(data.val_set.samples[0][0])
    Image.open(changed).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(changed)
    os.utime(changed, ns=(time.time_ns(), time.time_ns() + 10**9))
    main(tiny_probe_args(root, tmp_path))
    out = capsys.readouterr().out
    assert "val: 18 images, 32 features: extracted" in out and out.count("loaded from cache") == 2


def test_probe_checkpoint_is_a_fit_checkpoint_and_a_pretrained_source(tmp_path):
    import vit
    from vit.checkpoint import load_classifier, read_checkpoint

    root = noisy_colour_folder(tmp_path / "images", per_class=8)
    result = run(tiny_probe_args(root, tmp_path))
    checkpoint = read_checkpoint(result["checkpoint"])
    meta = checkpoint["vit"]
    assert meta["task"] == "classify" and meta["class_names"] == sorted(CLASSES) and not meta["ema"]
    assert all(k.startswith("model.") for k in checkpoint["state_dict"])
    classifier = load_classifier(result["checkpoint"])
    assert classifier.img_size == (32, 32) and classifier.model.num_classes == 3
    # Fine-tuning can start from it: backbone and the probe's head load into a fresh model.
    fresh = vit.create_model("vit_tiny_patch16_224", depth=1, embed_dim=32, num_heads=2, patch_size=8,
                             img_size=32, num_classes=3)
    assert not vit.load_pretrained(fresh, result["checkpoint"]).head_reset
    torch.testing.assert_close(fresh.head.weight, classifier.model.head.weight)


def test_probe_help_and_errors(capsys):
    with pytest.raises(SystemExit) as done:
        main(["probe", "--help"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    for option in ("--cache_dir", "--C", "--k", "--out", "--device", "--batch_size", "vit fit --help"):
        assert option in printed
    with pytest.raises(SystemExit):
        main(["probe"])
    assert "pass a config" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["probe", "--config", str(CONFIGS / "digits.yaml"), "--C", "0"])
    assert "--C must be positive" in capsys.readouterr().err


@pytest.mark.slow
def test_vit_probe_on_the_digits_in_under_30_s(tmp_path, digits_run, digit_pngs):
    """The done-when figure: the command, imports included, from random init and from a trained checkpoint."""
    figures = {}
    for name, extra in (("random", []), ("trained", ["--model.init_args.pretrained", str(digits_run.best)])):
        command = [sys.executable, "-m", "vit", "probe", "--config", str(CONFIGS / "digits.yaml"),
                   "--cache_dir", str(tmp_path / "cache"), "--out", str(tmp_path / f"{name}.ckpt"), *extra]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=300)
        seconds = time.perf_counter() - started
        assert done.returncode == 0, done.stderr[-3000:]
        lr = re.search(r"logistic regression .*test top-1 ([\d.]+)", done.stdout)
        knn = re.search(r"cosine kNN .*test top-1 ([\d.]+)", done.stdout)
        assert lr and knn, done.stdout
        figures[name] = (float(lr.group(1)), float(knn.group(1)), seconds)
    print(figures)
    assert figures["random"][2] < 30 and figures["trained"][2] < 30
    assert figures["trained"][0] > 0.9 and figures["trained"][1] > 0.9  # the trained features separate the digits
    # `vit predict` on the test digits as 8-bit PNGs scores the probe's test accuracy (PNG pixels are k/255 where
    # the datamodule holds v/16, and PIL resizes them: a digit or two may flip).
    paths, labels = digit_pngs
    rows = run(["predict", "--ckpt", str(tmp_path / "trained.ckpt"), *map(str, paths), "--out",
                 str(tmp_path / "p.csv"), "--top_k", "1"])
    accuracy = np.mean([int(r["classes"][0]) == label for r, label in zip(rows, labels)])
    assert accuracy == pytest.approx(figures["trained"][0], abs=2 / len(labels))
