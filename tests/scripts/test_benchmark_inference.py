"""scripts/bench/benchmark_inference.py runs end to end on a digits checkpoint (one short run: a smoke test, not a
timing)."""

import json

import pytest

from tests import CONFIGS


def test_inference_benchmark_times_every_backend_and_scores_the_digits(fitted, tmp_path):
    """The script in its own process, as a user runs it. In the test process it would leave OpenVINO's runtime
    loaded, and a later in-process DDP fit with bf16 (tests/scripts/test_gpu_check.py) then segfaulted
    (openvino 2026.4.1 beside torch 2.14.1; reproduced with these two tests alone)."""
    import subprocess
    import sys

    from tests import load_script, script_path
    from tests.conftest import subprocess_env

    best = next((fitted / "ckpt").glob("best-*.ckpt"))
    out = tmp_path / "inference.json"
    done = subprocess.run([sys.executable, str(script_path("benchmark_inference")), "--ckpt", str(best), "--config",
                           str(CONFIGS / "digits.yaml"), "--runs", "1", "--min_seconds", "0", "--threads", "1",
                           "--skip", "onnx-int8 dynamic", "--calibration_seed", "1", "--auto_budget", "2",
                           "--json", str(out)],
                          capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    expected = ["torch", "onnx", "onnx-int8", "openvino", "openvino-int8", "auto", "auto (int8 file)"]
    if "bf16" in result["cpu_flags"]:
        expected[1:1] = ["torch autocast bf16", "torch-bf16", "torch-bf16 sdpa"]
        expected.insert(expected.index("openvino-int8"), "openvino-bf16")
    assert [r["backend"] for r in rows] == expected
    bench = load_script("benchmark_inference")
    for name, candidates in bench.AUTO_SETS.items():  # auto chose within its own set, at each batch timed
        chosen = next(r for r in rows if r["backend"] == name)["chosen"]
        assert set(chosen) == {"b1", "b8"} and set(chosen.values()) <= set(candidates)
    # the FLOP/s figures: img/s times the model's FLOPs (a hand count of the digits ViT would be brittle: the
    # figure is checked for consistency), against a measured GEMM roof of the row's precision
    assert result["gflop_per_image"] > 0 and result["gemm_peaks"]["fp32"] > 1
    for r in rows:
        assert r["gflop_s_b8"] == pytest.approx(r["img_s_b8"] * result["gflop_per_image"])
        assert r["peak_fraction_b8"] == pytest.approx(r["gflop_s_b8"] / result["gemm_peaks"][r["gemm_roof"]])
        assert r["agreement"] == r["agree_fp32"]
    by_name = {r["backend"]: r for r in rows}
    for name in bench.AUTO_SETS:  # auto against its choice's own row, run by run (one run here: that ratio)
        auto_row, chosen = by_name[name], by_name[name]["chosen"]
        for b in (1, 8):
            assert auto_row[f"vs_chosen_b{b}"] == pytest.approx(auto_row[f"img_s_b{b}"]
                                                                / by_name[chosen[f"b{b}"]][f"img_s_b{b}"])
    assert by_name["torch"]["ratio_b8"] == 1.0 and by_name["torch"]["max_abs_diff"] == 0.0
    assert by_name["torch"]["median_margin"] > 0  # what a changed answer's margin is printed against
    for name in ("onnx", "openvino"):
        assert by_name[name]["max_abs_diff"] < 1e-4 and by_name[name]["agree_fp32"] == 1.0
        # top-1 is scored on the 359 test digits: the exact backends get the same score
        assert by_name[name]["top1"] == by_name["torch"]["top1"]
    for r in rows:
        assert r["img_s_b1"] > 0 and r["img_s_b8"] > 0 and 0 <= r["top1"] <= 1
        assert len(r["flipped_margins"]) == round((1 - r["agree_fp32"]) * result["images"]), r["backend"]
        assert (f"{r['backend']}: top-1 changed on" in done.stdout) == bool(r["flipped_margins"])
    assert result["calibration_seed"] == 1
    assert result["fastest"]["exact"] in ("torch", "onnx", "openvino")
    printed = done.stdout
    assert "CPU flags:" in printed and "| openvino-int8 |" in printed and "fastest exact" in printed


def test_flipped_margins_are_the_reference_margins_of_the_changed_answers():
    import torch

    from tests import load_script

    bench = load_script("benchmark_inference")
    reference = torch.tensor([[2.0, 1.0, 0.0], [0.5, 0.4, 0.0], [0.0, 0.3, 1.0], [1.0, 0.2, 0.9]])
    logits = torch.tensor([[2.0, 1.1, 0.0], [0.3, 0.6, 0.0], [0.0, 0.3, 1.0], [0.8, 0.2, 0.95]])
    # the second answer (0.5 over 0.4) and the fourth (1.0 over 0.9) change; a margin is top-1 minus runner-up
    assert bench.flipped_margins(reference, logits) == pytest.approx([0.1, 0.1])
    assert bench.flipped_margins(reference, reference) == []
    assert bench.top1_margins(reference).tolist() == pytest.approx([1.0, 0.1, 0.7, 0.1])


def test_the_calibration_seed_draws_other_training_images(fitted):
    """--calibration_seed picks the draw of training images, as `vit.deploy.quantize.config_split_images` makes it."""
    import torch

    from tests import load_script
    from vit.cli.data import config_split_images
    from vit.deploy import load_classifier

    bench = load_script("benchmark_inference")
    classifier = load_classifier(next((fitted / "ckpt").glob("best-*.ckpt")))
    config = str(CONFIGS / "digits.yaml")
    *_, first = bench.config_splits(config, None, 20, classifier)
    *_, second = bench.config_splits(config, None, 20, classifier, seed=1)
    drawn = config_split_images(config, "train", classifier.eval_transform(), "L", 20, seed=1)[0]
    assert not torch.equal(first, second) and torch.equal(second, drawn)


def test_each_backend_is_timed_for_at_least_min_seconds():
    """A backend 10x faster than eager gets about 10x the passes, so its timing lasts as long as eager's (with
    passes set by eager's time it lasted a tenth as long, and measured the machine's noise)."""
    import time

    import torch

    from tests import load_script

    bench = load_script("benchmark_inference")
    calls = {"torch": 0, "fast": 0}

    def runner(name: str, seconds: float):
        def run(x):
            calls[name] += 1
            time.sleep(seconds)
            return x
        return run

    speed = bench.timings({"torch": runner("torch", 0.02), "fast": runner("fast", 0.002)}, torch.zeros(4, 1),
                          4, 1, 0.06)
    # warm-up and a timed pass each, then ceil(0.06 / time of a pass) passes: 3 for eager (2 on a busy machine,
    # where a sleep overshoots), about 25 for "fast"
    assert calls["torch"] - 2 in (2, 3)
    assert calls["fast"] >= 2 + 12
    assert speed["fast"][0] > 4 * speed["torch"][0]


def test_an_auto_set_with_nothing_within_tolerance_is_said_so(capsys):
    """ViT-S's int8 file: both int8 engines changed a top-1 of eager's, so its auto row has no fixed row of its set
    to be read against (the benchmark crashed there before)."""
    from tests import load_script

    bench = load_script("benchmark_inference")
    rows = [{"backend": "torch", "agree_fp32": 1.0, "img_s_b8": 10.0},
            {"backend": "onnx-int8", "agree_fp32": 0.8, "img_s_b8": 30.0},
            {"backend": "openvino-int8", "agree_fp32": 0.9, "img_s_b8": 40.0},
            {"backend": "auto (int8 file)", "agree_fp32": 0.8, "img_s_b8": 30.0, "chosen": {"b8": "onnx-int8"},
             "vs_chosen_b8": 1.0}]
    bench.print_auto(rows, [8])
    printed = capsys.readouterr().out
    assert "none of its set is within tolerance of eager" in printed and "3.00x the fastest row" in printed
