"""`vit calibrate` (and `vit fit`, which ends by calibrating its best checkpoint): the stored temperature and
unknown score, then `vit predict` on the checkpoint and on its ONNX export giving the same answers, computed apart
with numpy from the stored numbers."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from tests.deploy.test_confidence import by_hand, images
from vit.commands import main, run


def test_calibrate_then_predict_answers_unknown_alike_on_checkpoint_and_onnx(calibrated, tmp_path, capsys):
    from vit.deploy.classifier import read_classifier
    from vit.deploy.export import export_onnx

    ckpt, printed = calibrated
    assert "temperature T = " in printed and "val ECE" in printed and f"calibrated {ckpt}" in printed
    paths = images(tmp_path / "images")
    probs, scores, stored = by_hand(ckpt, paths)
    assert stored["threshold"] > 0 and stored["acceptance"] == 0.95 and stored["label"] == "unknown"
    unknown = scores > stored["threshold"]
    assert unknown.any() and not unknown.all()  # both sides of the threshold are exercised
    export_onnx(read_classifier(ckpt), tmp_path / "onnx")
    onnx = tmp_path / "onnx" / "model.onnx"
    for model, backend in ((ckpt, "torch"), (onnx, "onnx"), (onnx, "openvino")):
        out = tmp_path / f"{backend}.json"
        rows = run(["predict", "--ckpt", str(model), *map(str, paths), "--out", str(out), "--top_k", "10",
                    "--backend", backend])
        assert [r["unknown"] for r in rows] == unknown.tolist(), backend
        assert [r["answer"] for r in rows] == [
            "unknown" if u else r["nearest"] for u, r in zip(unknown, rows)]
        # numpy reads the features of another float32 forward path, and a per-class precision magnifies their last
        # bits: a few 1e-4 on scores spread over several units
        np.testing.assert_allclose([r["score"] for r in rows], scores, rtol=5e-4, atol=5e-4)
        got = np.zeros_like(probs)
        for i, r in enumerate(rows):
            got[i, [e["class"] for e in r["top_k"]]] = [e["probability"] for e in r["top_k"]]
        np.testing.assert_allclose(got, probs, atol=1e-5)
        assert [r["nearest"] for r in rows] == [str(i) for i in probs.argmax(1)]
    assert "no unknown score" not in capsys.readouterr().out
    # the CSV: the unknown label as class_1 (no probability), the nearest class and the score in their own columns
    main(["predict", "--ckpt", str(ckpt), *map(str, paths), "--out", str(tmp_path / "p.csv")])
    table = list(csv.DictReader((tmp_path / "p.csv").open()))
    quantiles = np.array(stored["quantiles"])  # the val scores' percentiles: rarity by numpy's interpolation
    assert len(quantiles) == 101 and np.all(np.diff(quantiles) >= 0) and quantiles[95] <= stored["threshold"] + 1e-6
    for row, u, s in zip(table, unknown, scores):
        assert (row["class_1"] == "unknown") == u
        if u:  # in place of a probability: the share of val images scoring lower, >= the 95% accepted
            assert float(row["prob_1"]) == pytest.approx(np.interp(s, quantiles, np.linspace(0, 1, 101)), abs=1e-4)
            assert float(row["prob_1"]) >= 0.95 - 1e-6
        assert float(row["unknown_score"]) == pytest.approx(s, rel=5e-4, abs=5e-4) and row["nearest"] in "0123456789"
    # --accept_all: every image gets its class
    rows = run(["predict", "--ckpt", str(ckpt), *map(str, paths), "--out", str(tmp_path / "a.json"), "--accept_all"])
    assert not any(r["unknown"] for r in rows) and all(r["answer"] == r["nearest"] for r in rows)


def test_fit_ends_by_calibrating_its_best_checkpoint(tmp_path, capsys):
    from tests.conftest import short_digits_run
    from vit.checkpoints.io import read_checkpoint

    main(["fit", *short_digits_run(tmp_path), "--calibrate=true"])
    lines = capsys.readouterr().out.strip().splitlines()
    best = next((tmp_path / "ckpt").glob("best-*.ckpt"))
    # calibration first, then the test report (which uses the TTA calibration chose on val)
    done = [i for i, line in enumerate(lines) if line.startswith(f"calibrated {best}: vit predict and vit serve")]
    tested = [i for i, line in enumerate(lines) if line.startswith(f"test accuracy of {best}: ")]
    assert len(done) == len(tested) == 1 and done[0] < tested[0]
    last_lines = lines[done[0] - 5:done[0] + 1]
    assert any(line.startswith("temperature T = ") for line in last_lines)
    assert any(line.startswith("TTA flip (mirror averaged in): val top-1") for line in last_lines)
    drawn = [line.rsplit(": ", 1)[1] for line in last_lines if line.startswith("reliability diagram (val")]
    assert len(drawn) == 1 and Path(drawn[0]).stat().st_size > 10_000 and Path(drawn[0]).parent != best.parent
    stored = read_checkpoint(best)["confidence"]
    # the test uses the TTA calibration stored (handed over, not read back from the file)
    said_tta = [line for line in lines if line.startswith("testing with TTA ")]
    assert said_tta == ([f"testing with TTA {stored['tta']}: calibration measured it better on val"]
                        if stored["tta"] != "none" else [])
    layers = stored["stats"]["layers"]  # the one block's mean patch token and the pooled features
    # 10 classes of width 32 fit the byte budget: a covariance (stored as a float16 whitening factor or a
    # float32 precision) per class
    shapes = [(layer.get("whiten", layer.get("precision"))).shape for layer in layers]
    assert stored["temperature"] > 0 and shapes == [(10, 32, 32)] * 2
    assert stored["score"] == "mahalanobis_l2_layers_class_covariance"
    json.dumps({k: v for k, v in stored.items() if k != "stats"})  # the report is plain data


@pytest.mark.parametrize(("acceptance", "accepted"), [(1.0, True), (1.01, False), (0.0, False), (0.01, True)])
def test_calibrate_acceptance_is_in_the_half_open_unit_interval(acceptance, accepted):
    from vit.commands.calibrate import parse_args

    argv = ["--ckpt", "m.ckpt", "--acceptance", str(acceptance), "--config", "c.yaml"]
    if accepted:
        assert parse_args(argv)[0].acceptance == acceptance
    else:
        with pytest.raises(SystemExit):
            parse_args(argv)
