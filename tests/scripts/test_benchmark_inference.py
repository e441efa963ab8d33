"""scripts/benchmark_inference.py runs end to end on a digits checkpoint (one short run: a smoke test, not a timing)."""

import json

import pytest

from tests import load_script


def test_inference_benchmark_times_every_path_and_scores_the_digits(fitted, tmp_path, capsys):
    best = next((fitted / "ckpt").glob("best-*.ckpt"))
    out = tmp_path / "inference.json"
    benchmark = load_script("benchmark_inference")
    rows = benchmark.main(["--ckpt", str(best), "--runs", "1", "--min_seconds", "0", "--json", str(out)])
    assert json.loads(out.read_text())["rows"] == rows
    assert [r["path"] for r in rows] == ["torch fp32 eager", "torch bf16", "onnx fp32", "onnx int8"]
    by_path = {r["path"]: r for r in rows}
    assert by_path["torch fp32 eager"]["ratio"] == 1.0 and by_path["torch fp32 eager"]["max_abs_diff"] == 0.0
    assert by_path["onnx fp32"]["max_abs_diff"] < 1e-4 and by_path["onnx fp32"]["agree_fp32"] == 1.0
    for r in rows:
        assert r["img_s"] > 0 and 0 <= r["top1"] <= 1
    # top-1 is scored on the 359 test digits: the exact paths get the same score
    assert by_path["onnx fp32"]["top1"] == by_path["torch fp32 eager"]["top1"]
    printed = capsys.readouterr().out
    assert "vs torch fp32" in printed and "onnx int8" in printed


def test_inference_benchmark_refuses_a_non_digits_checkpoint_for_top1():
    from vit.checkpoint import Classifier

    module = load_script("benchmark_inference")
    rgb = module.random_classifier("vit_cifar_patch4_32", 10)
    assert isinstance(rgb, Classifier) and rgb.in_chans == 3
    with pytest.raises(ValueError, match=r"must be a digits checkpoint .* use --model NAME"):
        module.digits_test_set(rgb)
