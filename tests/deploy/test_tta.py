"""Test-time augmentation (`--tta flip`): the logits are the mean of the model's on the image and on its mirror
(torch.flip by hand), it is chosen on val only where it measured better, predict and serve follow the stored choice
unless overridden, and they answer alike with it on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.deploy.test_confidence import by_hand, images
from vit.commands import run
from vit.deploy.calibration import calibration_figures, choose_tta, fit_temperature
from vit.deploy.confidence import tta_logits


def with_tta(calibrated: tuple[Path, str], folder: Path, tta: str) -> Path:
    """A copy of the calibrated checkpoint whose stored choice is ``tta``."""
    from vit.checkpoints.io import read_checkpoint, save_checkpoint

    folder.mkdir(exist_ok=True)
    checkpoint = read_checkpoint(calibrated[0])
    checkpoint["confidence"]["tta"] = tta
    return save_checkpoint(checkpoint, folder / f"tta_{tta}.ckpt")


def test_tta_logits_are_the_mean_over_the_image_and_its_mirror():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 5, 6))  # not mirror-invariant
    x = torch.randn(2, 3, 4, 5)
    with torch.no_grad():
        plain, mirrored = model(x), model(torch.flip(x, dims=[3]))
        torch.testing.assert_close(tta_logits(model, x, "flip"), (plain + mirrored) / 2)
        torch.testing.assert_close(tta_logits(model, x, "flip", logits=plain), (plain + mirrored) / 2)
        torch.testing.assert_close(tta_logits(model, x, "none"), plain)
    assert not torch.allclose(plain, mirrored, atol=1e-3)  # so the two switch values are told apart
    with pytest.raises(ValueError, match="tta must be one of none, flip"):
        tta_logits(model, x, "crops")


def test_tta_is_chosen_only_where_it_measured_better_on_val():
    labels = torch.tensor([0, 1, 0, 1, 0])  # the last one wrong either way: T stays finite
    plain = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # the 4th wrong too
    fixed = plain.clone()
    fixed[3] = torch.tensor([0.0, 1.0])
    assert choose_tta(plain, fixed, labels)[0] == "flip"  # one more right
    assert choose_tta(fixed, plain, labels)[0] == "none"  # one more wrong: it flipped a right answer
    surer = fixed.clone()
    surer[3] = torch.tensor([0.0, 3.0])  # same top-1, lower NLL after each one's T
    tta, figures = choose_tta(fixed, surer, labels)
    nll = {name: calibration_figures(lg, labels, fit_temperature(lg, labels))["nll"]
           for name, lg in (("none", fixed), ("flip", surer))}
    assert figures["none"]["top1"] == figures["flip"]["top1"] == 0.8 and nll["flip"] < nll["none"]
    assert tta == "none" and choose_tta(surer, fixed, labels)[0] == "none"  # surer, no more right: not worth it


def test_calibrate_measures_tta_on_val_and_records_the_choice(calibrated):
    from vit.checkpoints.io import read_checkpoint

    stored = read_checkpoint(calibrated[0])["confidence"]
    report = stored["report"]["tta"]
    expected = choose_tta_from(report)
    assert stored["tta"] == report["chosen"] == expected
    # a wall-clock ratio (two forward passes per image against one): measured and stated, but a busy machine can
    # slow either pass (0.51 came out once in CI), so only its presence is held here
    assert report["time_ratio"] > 0
    assert "TTA flip (mirror averaged in): val top-1" in calibrated[1]


def choose_tta_from(report: dict) -> str:
    """The rule, restated on the recorded figures: more right."""
    return "flip" if report["flip"]["top1"] > report["none"]["top1"] else "none"


def all_probabilities(rows: list[dict]) -> np.ndarray:
    """Each record's probabilities (rounded to 6 decimals), in class order."""
    return np.array([[e["probability"] for e in sorted(r["top_k"], key=lambda e: e["class"])] for r in rows])


@pytest.mark.parametrize("stored", ["none", "flip"])
def test_predict_follows_the_stored_choice_unless_overridden(calibrated, tmp_path, stored):
    ckpt = with_tta(calibrated, tmp_path / "ckpt", stored)
    paths = images(tmp_path / "images")
    for override in (None, "none", "flip"):
        probs, _, _ = by_hand(ckpt, paths, tta=override or stored)
        rows = run(["predict", "--ckpt", str(ckpt), *map(str, paths), "--out", str(tmp_path / "p.json"),
                    "--top_k", "10", *(["--tta", override] if override else [])])
        np.testing.assert_allclose(all_probabilities(rows), probs, atol=2e-6)  # the records round to 1e-6
    plain, _, _ = by_hand(ckpt, paths, tta="none")
    flipped, _, _ = by_hand(ckpt, paths, tta="flip")
    assert np.abs(plain - flipped).max() > 2e-5  # 10x the tolerance: the switch is seen (a barely trained model)


def test_serve_answers_as_predict_does_with_tta_on(calibrated, tmp_path):
    from tests.serve.conftest import client_of, make_app
    from vit.deploy import load_classifier
    from vit.deploy.classifier import read_classifier
    from vit.deploy.export import export_onnx
    from vit.serve.core import Predictor

    ckpt = with_tta(calibrated, tmp_path / "ckpt", "flip")
    paths = images(tmp_path / "images")
    export_onnx(read_classifier(ckpt), tmp_path / "onnx")

    async def served(model: Path) -> list[dict]:
        async with client_of(make_app(Predictor(load_classifier(model)), top_k=10)) as client:
            assert (await client.get("/info")).json()["calibration"]["tta"] == "flip"
            return [(await client.post("/predict", content=p.read_bytes(),
                                       headers={"Content-Type": "image/png"})).json() for p in paths]

    for model in (ckpt, tmp_path / "onnx" / "model.onnx"):
        predicted = run(["predict", "--ckpt", str(model), *map(str, paths), "--out", str(tmp_path / "p.json"),
                         "--top_k", "10"])
        got = asyncio.run(served(model))
        assert [a["answer"] for a in got] == [r["answer"] for r in predicted], model
        np.testing.assert_allclose(all_probabilities(got), all_probabilities(predicted), atol=2e-6)
        probs, _, _ = by_hand(ckpt, paths, tta="flip")
        np.testing.assert_allclose(all_probabilities(got), probs, atol=2e-6)
