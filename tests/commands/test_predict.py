"""`vit predict --ckpt`: top-k CSV/JSON, the same inputs as testing."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit.checkpoint import load_classifier
from vit.commands import main


def test_predict_writes_topk_csv_and_json(fitted, tmp_path, capsys):
    from sklearn.datasets import load_digits

    folder = tmp_path / "images"
    folder.mkdir()
    digits = load_digits()
    for i in range(5):
        pixels = np.clip(digits.images[i] * 16, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"digit{i}.png")
    (folder / "readme.txt").write_text("not an image")
    rgb = folder / "colour.jpg"
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(rgb)  # other size and mode: resized, grey

    best = str(sorted((fitted / "ckpt").glob("best-*.ckpt"))[0])
    out_csv = tmp_path / "preds.csv"
    with pytest.warns(UserWarning, match="skipped 1 files that are not images"):
        main(["predict", "--ckpt", best, str(folder), "--out", str(out_csv), "--top_k", "3"])
    assert "wrote 6 predictions" in capsys.readouterr().out
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 6
    assert list(rows[0]) == ["path", "class_1", "prob_1", "class_2", "prob_2", "class_3", "prob_3"]
    for row in rows:
        probs = [float(row[f"prob_{k}"]) for k in (1, 2, 3)]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
        assert {row[f"class_{k}"] for k in (1, 2, 3)} <= {str(d) for d in range(10)}

    out_json = tmp_path / "preds.json"
    main(["predict", "--ckpt", best, str(folder / "digit0.png"), str(rgb), "--out", str(out_json),
          "--top_k", "10"])
    preds = json.loads(out_json.read_text())
    assert [Path(p["path"]).name for p in preds] == ["digit0.png", "colour.jpg"]
    assert sum(preds[0]["probs"]) == pytest.approx(1.0, abs=1e-4)
    # the probabilities of a forward pass by hand: the image as the checkpoint's transform prepares it
    classifier = load_classifier(best)
    image = classifier.eval_transform()(Image.open(folder / "digit0.png").convert("L"))
    with torch.no_grad():
        expected = classifier(image[None]).softmax(-1)[0]
    order = expected.argsort(descending=True).tolist()
    assert preds[0]["classes"] == [str(i) for i in order]
    np.testing.assert_allclose(preds[0]["probs"], expected[order].numpy(), atol=1e-6)
    assert rows[[Path(r["path"]).name for r in rows].index("digit0.png")]["class_1"] == preds[0]["classes"][0]

    with pytest.raises(FileNotFoundError, match="no such image file or folder"):
        main(["predict", "--ckpt", best, str(tmp_path / "missing.png")])


@pytest.mark.slow
def test_predict_on_image_files_matches_the_datamodule_inputs(digits_run, digit_pngs):
    """PNG files of the test digits, prepared from the checkpoint alone, get the probabilities the model
    gives the datamodule's own tensors (same size, interpolation and normalisation)."""
    from vit.commands.predict import predict_files
    from vit.data import Digits

    classifier = load_classifier(digits_run.best)
    assert classifier.img_size == (16, 16) and classifier.interpolation == "bilinear"
    data = Digits(img_size=16)
    data.setup("test")
    paths, labels = digit_pngs
    rows = predict_files(classifier, paths, top_k=10)
    ours = torch.tensor([[dict(zip(r["classes"], r["probs"]))[str(c)] for c in range(10)] for r in rows])
    with torch.no_grad():
        expected = classifier(torch.stack([data.test_set[k][0] for k in range(len(paths))])).softmax(-1)
    # PNGs hold 8-bit pixels (k/255) where the datamodule has the digits' exact v/16: a small difference
    torch.testing.assert_close(ours, expected, atol=0.03, rtol=0)
    predicted = ours.argmax(-1)
    assert len(set(predicted.tolist())) == 10  # a trained model: every class is predicted somewhere
    assert (predicted == torch.as_tensor(labels)).float().mean() >= 0.9
