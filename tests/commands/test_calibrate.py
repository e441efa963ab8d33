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
        # the classes stay the model's top ones; the decision sits beside them
        assert [r["top_k"][0]["name"] for r in rows] == [str(i) for i in probs.argmax(1)], backend
        assert [r["answer"] for r in rows] == [
            "unknown" if u else str(i) for u, i in zip(unknown, probs.argmax(1))], backend
        # numpy reads the features of another float32 forward path, and a per-class precision magnifies their last
        # bits: a few 1e-4 on scores spread over several units
        np.testing.assert_allclose([r["score"] for r in rows], scores, rtol=5e-4, atol=5e-4)
        got = np.zeros_like(probs)
        for i, r in enumerate(rows):
            got[i, [e["class"] for e in r["top_k"]]] = [e["probability"] for e in r["top_k"]]
        np.testing.assert_allclose(got, probs, atol=1e-5)
        assert not any("nearest" in r or "rarity" in r for r in rows)
    assert "no unknown score" not in capsys.readouterr().out
    # the CSV: class_1/prob_1 the top class and its calibrated probability on every row, the decision and the score
    # in their own columns
    main(["predict", "--ckpt", str(ckpt), *map(str, paths), "--out", str(tmp_path / "p.csv")])
    table = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert list(table[0]) == ["path", *(f"{n}_{i}" for i in range(1, 6) for n in ("class", "prob")), "answer",
                              "unknown_score", "error"]
    for row, u, s, p in zip(table, unknown, scores, probs):
        assert row["class_1"] == str(p.argmax()) and float(row["prob_1"]) == pytest.approx(p.max(), abs=1e-5)
        assert row["answer"] == ("unknown" if u else row["class_1"])
        assert float(row["unknown_score"]) == pytest.approx(s, rel=5e-4, abs=5e-4)
    # --accept_all: every image gets its class
    rows = run(["predict", "--ckpt", str(ckpt), *map(str, paths), "--out", str(tmp_path / "a.json"), "--accept_all"])
    assert not any(r["unknown"] for r in rows) and all(r["answer"] == r["top_k"][0]["name"] for r in rows)


def test_class_1_is_the_timm_exports_argmax_and_answer_differs_on_exactly_the_rejected_rows(calibrated, tmp_path):
    """A consumer that reads class_1 gets the label of the timm Hub export (which cannot say unknown) on every row;
    one that reads answer gets "unknown" on the rows scored over the threshold, and class_1 on the others."""
    import timm
    import torch
    from PIL import Image

    ckpt, _ = calibrated
    paths = images(tmp_path / "images")
    _, scores, stored = by_hand(ckpt, paths)
    rejected = (scores > stored["threshold"]).tolist()
    assert any(rejected) and not all(rejected)
    main(["export", "--ckpt", str(ckpt), "--format", "hub", "--out", str(tmp_path / "hub")])
    main(["predict", "--ckpt", str(ckpt), *map(str, paths), "--out", str(tmp_path / "p.csv")])
    table = list(csv.DictReader((tmp_path / "p.csv").open()))
    model = timm.create_model(f"local-dir:{tmp_path / 'hub'}", pretrained=True).eval()
    names = model.pretrained_cfg["label_names"]
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
    with torch.no_grad():
        argmax = [names[int(model(transform(Image.open(p).convert("RGB"))[None]).argmax())] for p in paths]
    assert [row["class_1"] for row in table] == argmax
    assert [row["answer"] != row["class_1"] for row in table] == rejected
    assert all(row["answer"] == "unknown" for row, r in zip(table, rejected) if r)


def test_calibrate_reads_the_runs_own_config_yaml(fitted, tmp_path, capsys):
    """The run's config.yaml (its ckpt_path and every option `vit fit` saved) is the data: nothing typed twice."""
    import shutil

    import yaml

    from vit.checkpoints.io import read_checkpoint

    # the fit's: the first written (`vit test` and `vit validate` runs of the same folder may add theirs)
    saved = min(fitted.rglob("config.yaml"), key=lambda p: p.stat().st_mtime_ns)
    assert "ckpt_path" in yaml.safe_load(saved.read_text())  # the key `vit calibrate` refused
    ckpt = tmp_path / "c.ckpt"
    shutil.copy(next((fitted / "ckpt").glob("best-*.ckpt")), ckpt)
    stored = run(["calibrate", "--ckpt", str(ckpt), "--config", str(saved)])
    assert stored["temperature"] > 0 and stored["threshold"] is not None
    assert f"calibrated {ckpt}" in capsys.readouterr().out
    # a `vit test` or `vit predict` run's config.yaml holds its Trainer method's own keys: read as well
    for method_keys in ({"verbose": True}, {"return_predictions": None}):
        other = tmp_path / f"{next(iter(method_keys))}.yaml"
        other.write_text(yaml.safe_dump({**yaml.safe_load(saved.read_text()), **method_keys}))
        assert run(["calibrate", "--ckpt", str(ckpt), "--config", str(other), "--calibrate", "temperature",
                    "--out", str(tmp_path / "o.ckpt")])["temperature"] > 0
    # --calibrate temperature: T alone, what `vit fit` stores by default
    alone = run(["calibrate", "--ckpt", str(ckpt), "--config", str(saved), "--calibrate", "temperature"])
    assert alone["temperature"] > 0 and alone["threshold"] is None and alone["tta"] == "none"
    if stored["tta"] == "none":  # T on the same logits (with the unknown score, T is fit after the TTA choice)
        assert alone["temperature"] == pytest.approx(stored["temperature"])
    assert read_checkpoint(ckpt)["confidence"]["stats"] is None


def fit_lines(root: Path, capsys, *extra: str) -> list[str]:
    """A seconds-long digits fit with ``extra`` (no --calibrate unless given: `vit fit`'s default), its printed
    lines."""
    from tests.conftest import short_digits_run

    args = [a for a in short_digits_run(root) if not a.startswith("--calibrate")]
    main(["fit", *args, "--test_after_fit=false", *extra])
    return capsys.readouterr().out.strip().splitlines()


def test_a_plain_fit_stores_a_temperature_alone_in_best_and_last_and_reports_ece(tmp_path, capsys):
    from vit.checkpoints.io import read_checkpoint

    lines = fit_lines(tmp_path, capsys)
    best = next((tmp_path / "ckpt").glob("best-*.ckpt"))
    assert any(line.startswith("temperature T = ") for line in lines[-6:]), lines[-6:]
    assert any(line.strip().startswith("val ECE ") for line in lines[-6:]), lines[-6:]
    for path in (best, tmp_path / "ckpt" / "last.ckpt"):
        stored = read_checkpoint(path)["confidence"]
        assert stored["temperature"] > 0 and stored["temperature"] != 1.0, path
        # T alone: no unknown score or threshold (a few bytes), no TTA (it can change a label; T cannot)
        assert stored["stats"] is None and stored["threshold"] is None and stored["tta"] == "none", path
    assert read_checkpoint(best)["confidence"]["temperature"] == read_checkpoint(
        tmp_path / "ckpt" / "last.ckpt")["confidence"]["temperature"]  # one epoch: the same weights, the same T
    assert f"calibrated {tmp_path / 'ckpt' / 'last.ckpt'} too (the same weights as the best checkpoint: the same " \
        "calibration)" in lines


def test_calibrate_false_leaves_the_checkpoints_as_trained(tmp_path, capsys):
    from vit.checkpoints.io import read_checkpoint

    lines = fit_lines(tmp_path, capsys, "--calibrate=false")
    assert not any("ECE" in line for line in lines)
    assert all("confidence" not in read_checkpoint(p) for p in (tmp_path / "ckpt").glob("*.ckpt"))


@pytest.mark.parametrize("spelling", ["unknown", "true"])
def test_fit_ends_by_calibrating_its_best_checkpoint(tmp_path, capsys, spelling):
    from tests.conftest import short_digits_run
    from vit.checkpoints.io import read_checkpoint

    main(["fit", *short_digits_run(tmp_path), f"--calibrate={spelling}"])
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
    # last.ckpt answers alike: the README's examples predict with it
    assert read_checkpoint(tmp_path / "ckpt" / "last.ckpt")["confidence"]["threshold"] == stored["threshold"]
    assert any(line.startswith(f"calibrated {tmp_path / 'ckpt' / 'last.ckpt'} too") for line in lines)


@pytest.mark.parametrize(("acceptance", "accepted"), [(1.0, True), (1.01, False), (0.0, False), (0.01, True)])
def test_calibrate_acceptance_is_in_the_half_open_unit_interval(acceptance, accepted):
    from vit.commands.calibrate import parse_args

    argv = ["--ckpt", "m.ckpt", "--acceptance", str(acceptance), "--config", "c.yaml"]
    if accepted:
        assert parse_args(argv)[0].acceptance == acceptance
    else:
        with pytest.raises(SystemExit):
            parse_args(argv)
