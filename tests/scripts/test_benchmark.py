"""scripts/benchmark.py runs end to end (tiny config, one run: a smoke test, not a timing)."""

import importlib.util
import json

import pytest

from tests import SCRIPTS

SCRIPT = SCRIPTS / "benchmark.py"


def test_benchmark_script_writes_a_row_per_mode_and_precision(tmp_path):
    spec = importlib.util.spec_from_file_location("benchmark", SCRIPT)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    out = tmp_path / "bench.json"
    rows = benchmark.main(["--model", "vit_digits_patch2_8", "--batch-size", "4", "--runs", "1",
                           "--iters", "1", "--warmup", "0", "--json", str(out)])
    saved = json.loads(out.read_text())["rows"]
    assert saved == rows
    assert {(r["mode"], r["precision"]) for r in rows} == {
        ("infer", "fp32"), ("train", "fp32"), ("infer", "bf16"), ("train", "bf16")
    }
    for r in rows:
        assert r["ours_img_s"] > 0 and r["timm_img_s"] > 0
        assert r["ratio_median"] == pytest.approx(r["ours_img_s"] / r["timm_img_s"])
        # the cls-only last block means we count fewer FLOPs than timm for the same logits
        assert 0 < r["ours_gflop_per_step"] <= r["timm_gflop_per_step"]
