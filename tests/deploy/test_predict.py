"""predict_files (`vit.deploy.predict`) on image files: the DataModule's probabilities from the checkpoint alone, and
the ONNX export's top-1 on every test digit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.commands.test_predict import by_name
from vit.deploy import load_classifier


@pytest.mark.slow
def test_predict_on_image_files_matches_the_datamodule_inputs(digits_run, digit_pngs):
    """PNG files of the test digits, prepared from the checkpoint alone, get the probabilities the model
    gives the datamodule's own tensors (same size, interpolation and normalisation)."""
    from vit.data import Digits
    from vit.deploy.predict import predict_files

    classifier = load_classifier(digits_run.best)
    assert classifier.img_size == (16, 16) and classifier.interpolation == "bilinear"
    data = Digits(img_size=16)
    data.setup("test")
    paths, labels = digit_pngs
    rows = predict_files(classifier, paths, top_k=10)
    ours = torch.tensor([[by_name(r)[str(c)] for c in range(10)] for r in rows])
    with torch.no_grad():
        expected = classifier(torch.stack([data.test_set[k][0] for k in range(len(paths))])).softmax(-1)
    # PNGs hold 8-bit pixels (k/255) where the datamodule has the digits' exact v/16: a small difference
    torch.testing.assert_close(ours, expected, atol=0.03, rtol=0)
    predicted = ours.argmax(-1)
    assert len(set(predicted.tolist())) == 10  # a trained model: every class is predicted somewhere
    assert (predicted == torch.as_tensor(labels)).float().mean() >= 0.9


@pytest.mark.slow
def test_onnx_export_gives_the_checkpoints_top1_on_every_test_digit(digits_run, digit_pngs, tmp_path):
    """The issue's bar: `vit predict model.onnx` and `vit predict best.ckpt` agree on every file; int8 stays close."""
    from vit.deploy import load_classifier
    from vit.deploy.export import export_onnx
    from vit.deploy.predict import predict_files

    classifier = load_classifier(digits_run.best)
    export_onnx(classifier, tmp_path, quantize="int8")
    paths, labels = digit_pngs
    rows = {name: predict_files(load_classifier(path), paths, top_k=10) for name, path in
            [("ckpt", digits_run.best), ("onnx", tmp_path / "model.onnx"), ("int8", tmp_path / "model.int8.onnx")]}
    top1 = {name: np.array([r["top_k"][0]["class"] for r in found]) for name, found in rows.items()}
    assert (top1["onnx"] == top1["ckpt"]).all()
    for a, b in zip(rows["ckpt"], rows["onnx"]):
        assert by_name(a) == pytest.approx(by_name(b), abs=1e-5)
    accuracy = {name: (found == labels).mean() for name, found in top1.items()}
    assert accuracy["ckpt"] >= 0.9
    assert accuracy["int8"] >= accuracy["ckpt"] - 0.01, accuracy  # the goal is 0.5 points; see the note
