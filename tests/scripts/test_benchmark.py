"""scripts/bench/benchmark.py runs end to end (tiny config, one run: a smoke test, not a timing)."""

import json

import pytest
import torch

from tests import load_script


def test_benchmark_script_writes_a_row_per_mode_and_precision(tmp_path):
    benchmark = load_script("benchmark")
    out = tmp_path / "bench.json"
    rows = benchmark.main(["--model", "vit_digits_patch2_8", "--batch_size", "4", "--runs", "1",
                           "--iters", "1", "--warmup", "0", "--peak_size", "256", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["rows"] == rows
    peaks = saved["matmul_peak_gflop_s"]
    assert set(peaks) == {"fp32", "bf16"} and min(peaks.values()) > 0
    assert {(r["mode"], r["precision"]) for r in rows} == {
        ("infer", "fp32"), ("train", "fp32"), ("infer", "bf16"), ("train", "bf16")
    }
    for r in rows:
        assert r["ours_img_s"] > 0 and r["timm_img_s"] > 0
        assert r["ratio_median"] == pytest.approx(r["ours_img_s"] / r["timm_img_s"])
        # the cls-only last block means we count fewer FLOPs than timm for the same logits
        assert 0 < r["ours_gflop_per_step"] <= r["timm_gflop_per_step"]
        # MFU: the achieved rate over the matmul peak measured in the same run, for the row's precision
        assert r["peak_gflop_s"] == peaks[r["precision"]]
        assert r["ours_mfu"] == pytest.approx(r["ours_gflop_s"] / r["peak_gflop_s"]) and r["ours_mfu"] > 0
        assert r["timm_mfu"] == pytest.approx(r["timm_gflop_s"] / r["peak_gflop_s"]) and r["timm_mfu"] > 0


def test_matmul_peak_counts_2n3_flops_of_the_faster_layout():
    benchmark = load_script("benchmark")
    results, seconds = [], iter([0.5, 0.5, 0.25, 0.25])  # a @ b twice, then F.linear(a, b) twice

    def fake_time_it(step, iters, device):
        results.append(step())
        return next(seconds)

    benchmark.time_it = fake_time_it
    assert benchmark.matmul_peak("fp32", size=64, repeats=2) == pytest.approx(2 * 64**3 / 0.25 / 1e9)
    assert len(results) == 4 and all(r.shape == (64, 64) and r.dtype == torch.float32 for r in results)
    assert torch.equal(results[0], results[1]) and not torch.equal(results[1], results[2])  # two layouts
    results.clear()
    seconds = iter([1.0, 1.0])
    assert benchmark.matmul_peak("bf16", size=64, repeats=1) == pytest.approx(2 * 64**3 / 1e9)
    assert results[-1].dtype == torch.bfloat16
