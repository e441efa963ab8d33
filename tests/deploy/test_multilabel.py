"""A multi-label model's answers: `vit predict` (JSON and CSV), `vit serve` and the exported ONNX file list the same
labels, cut at the thresholds the checkpoint holds; a single-label checkpoint answers as before."""

from __future__ import annotations

import asyncio
import csv
import json

import pytest
import torch

from tests.serve.conftest import client_of, make_app
from vit.commands.predict import main as predict
from vit.deploy import load_classifier
from vit.deploy.classifier import read_classifier, read_hub_classifier
from vit.deploy.export import export_onnx, export_safetensors
from vit.serve.core import Predictor

NAMES = ["top_left", "top_right", "bottom_left", "bottom_right"]


def expected_labels(quadrant_run) -> tuple[list[list[str]], torch.Tensor, list[float]]:
    """Each test image's labels, by hand: the network's logits on the pixels as the classifier's 1-channel default
    normalises them, a sigmoid, and the checkpoint's thresholds."""
    from tests.dummies import quadrant_pixels

    ckpt = quadrant_run / "model.ckpt"
    thresholds = torch.load(ckpt, weights_only=False)["vit"]["thresholds"]
    pixels, _ = quadrant_pixels(len(list((quadrant_run / "images").glob("*.png"))), seed=2)
    with torch.no_grad():
        probs = torch.sigmoid(read_classifier(ckpt).model((pixels.float() / 255 - 0.5) / 0.5))
    labels = [[NAMES[c] for c in row.argsort(descending=True).tolist() if row[c] >= thresholds[c]] for row in probs]
    return labels, probs, thresholds


def test_predict_serve_and_onnx_list_the_same_labels_at_the_checkpoints_thresholds(quadrant_run, tmp_path):
    ckpt = quadrant_run / "model.ckpt"
    files = sorted((quadrant_run / "images").glob("*.png"))
    labels, probs, thresholds = expected_labels(quadrant_run)
    # the case is not trivial: some images have several labels, some classes are left out
    assert any(len(x) > 1 for x in labels) and any(len(x) < 4 for x in labels)
    # onnxruntime's float rounding may flip a probability within 1e-4 of its cut: those images are left out there
    clear = ((probs - torch.tensor(thresholds)).abs() > 1e-4).all(1).tolist()
    assert sum(clear) >= len(clear) - 3
    assert thresholds != [0.5] * 4  # chosen, not the default

    rows = predict(["--ckpt", str(ckpt), *map(str, files), "--out", str(tmp_path / "p.json"), "--top_k", "2"])
    written = json.loads((tmp_path / "p.json").read_text())
    assert [[e["name"] for e in r["labels"]] for r in written] == labels
    for r, p in zip(written, probs):  # each label with its sigmoid probability; the top-k beside them
        # within 1e-5: a batch of 64 and 3 sums in another order than one of 67, and 6 decimals may round apart
        assert [e["probability"] for e in r["labels"]] == pytest.approx(
            [p[NAMES.index(e["name"])].item() for e in r["labels"]], abs=1e-5, rel=0)
        assert [e["name"] for e in r["top_k"]] == [NAMES[i] for i in p.topk(2).indices.tolist()]
    predict(["--ckpt", str(ckpt), *map(str, files), "--out", str(tmp_path / "p.csv"), "--top_k", "2"])
    table = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert list(table[0])[:3] == ["path", "labels", "label_probs"]
    assert [row["labels"].split(";") if row["labels"] else [] for row in table] == labels

    export_onnx(read_classifier(ckpt), tmp_path / "onnx")
    onnx = load_classifier(tmp_path / "onnx" / "model.onnx")
    assert onnx.thresholds == thresholds  # the metadata carries the checkpoint's cut
    from vit.deploy.predict import predict_files

    onnx_rows = predict_files(onnx, files, top_k=2)
    onnx_labels = [[e["name"] for e in r["labels"]] for r in onnx_rows]
    assert [x for x, ok in zip(onnx_labels, clear) if ok] == [x for x, ok in zip(labels, clear) if ok]

    async def served() -> list[list[str]]:
        async with client_of(make_app(Predictor(load_classifier(ckpt)))) as client:
            answers = [await client.post("/predict?top_k=2", files={"file": (f.name, f.read_bytes())}) for f in files]
        assert all(a.status_code == 200 for a in answers)
        return [[e["name"] for e in a.json()["labels"]] for a in answers]

    assert asyncio.run(served()) == labels
    assert [r["labels"] for r in rows] == [r["labels"] for r in written]


def test_the_timm_folder_export_carries_the_multi_label_flag_and_thresholds(quadrant_run, tmp_path):
    classifier = read_classifier(quadrant_run / "model.ckpt")
    export_safetensors(classifier, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["multi_label"] is True and config["thresholds"] == classifier.thresholds
    assert read_hub_classifier(tmp_path).thresholds == classifier.thresholds


def test_a_single_label_checkpoint_answers_as_before(fitted, digit_pngs, tmp_path):
    ckpt = next((fitted / "ckpt").glob("best-*.ckpt"))
    assert read_classifier(ckpt).thresholds is None
    files = digit_pngs[0][:3]
    rows = predict(["--ckpt", str(ckpt), *map(str, files), "--out", str(tmp_path / "p.csv"), "--top_k", "2"])
    assert all("labels" not in r for r in rows)
    # the decision beside the classes (its top class: no unknown score)
    assert next(csv.reader((tmp_path / "p.csv").open())) == ["path", "class_1", "prob_1", "class_2", "prob_2",
                                                             "answer", "error"]
    # softmax probabilities: each row's top-2 sum to at most 1
    assert all(sum(e["probability"] for e in r["top_k"]) <= 1 + 1e-6 for r in rows)


def test_tta_flip_is_refused_for_a_multi_label_model_in_one_line_and_kept_for_a_single_label_one(
        quadrant_run, fitted, digit_pngs, tmp_path, capsys):
    """A multi-label model's thresholds were chosen on val without TTA, and nothing measured flip against them: its
    `--tta flip` is refused (vit predict, and vit serve at start); `--tta none` and a single-label flip still run."""
    from vit.commands import main

    ckpt = quadrant_run / "model.ckpt"
    files = [str(p) for p in sorted((quadrant_run / "images").glob("*.png"))[:2]]
    with pytest.raises(SystemExit) as done:
        main(["predict", "--ckpt", str(ckpt), *files, "--out", str(tmp_path / "p.json"), "--tta", "flip"])
    err = capsys.readouterr().err
    assert done.value.code == 1 and "--tta flip is for single-label models" in err and len(err.splitlines()) <= 2
    assert not (tmp_path / "p.json").exists()
    with pytest.raises(ValueError, match="--tta flip is for single-label models"):
        Predictor(load_classifier(ckpt), tta="flip")
    assert len(predict(["--ckpt", str(ckpt), *files, "--out", str(tmp_path / "n.json"), "--tta", "none"])) == 2
    single = next((fitted / "ckpt").glob("best-*.ckpt"))
    rows = predict(["--ckpt", str(single), str(digit_pngs[0][0]), "--out", str(tmp_path / "s.json"), "--tta", "flip"])
    assert rows[0]["top_k"]
