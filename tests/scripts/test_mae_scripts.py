"""scripts/experiments/pretrain_digits.py and scripts/bench/benchmark_mae.py run end to end (tiny settings: smoke
tests)."""

import json

import pytest

from tests import load_script

TINY = ["--mae_epochs", "1", "--steps", "2", "--lrs", "0.001"]


@pytest.mark.slow
def test_pretrain_digits_reports_every_arm_and_a_draw_reproduces_alone(tmp_path):
    demo = load_script("pretrain_digits")
    out = tmp_path / "mae.json"
    both = demo.main([*TINY, "--draws", "0", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == both
    runs = both["2"]
    assert set(runs) == {"scratch", "MAE fine-tune", "MAE probe"}
    for result in runs.values():  # a test top-1 is a count of the 359 test digits
        assert len(result["test"]) == 2 and all(abs(a * 359 - round(a * 359)) < 1e-4 for a in result["test"])
        assert result["lr"] == [0.001, 0.001]
    alone = demo.main([*TINY, "--draws", "1"])["2"]  # each run is seeded by its draw alone
    assert {arm: r["test"][0] for arm, r in alone.items()} == {arm: r["test"][1] for arm, r in runs.items()}


@pytest.mark.slow
def test_benchmark_mae_times_and_counts_each_decoder():
    ratios = load_script("benchmark_mae").main(["--model", "vit_digits_patch4_16", "--steps", "1", "--threads", "1",
                                                "--decoders", "32,1,2", "64,2,4"])
    assert set(ratios["time"]) == set(ratios["flops"]) == {"32,1,2", "64,2,4"}
    assert all(r > 0 for r in ratios["time"].values())
    assert ratios["flops"]["32,1,2"] < ratios["flops"]["64,2,4"]  # a deeper, wider decoder does more work
