"""scripts/benchmark_inference.py runs end to end on a digits checkpoint (one short run: a smoke test, not a timing)."""

import json

from tests import CONFIGS


def test_inference_benchmark_times_every_backend_and_scores_the_digits(fitted, tmp_path):
    """The script in its own process, as a user runs it. In the test process it would leave OpenVINO's runtime
    loaded, and a later in-process DDP fit with bf16 (tests/scripts/test_gpu_check.py) then segfaulted
    (openvino 2026.4.1 beside torch 2.14.1; reproduced with these two tests alone)."""
    import subprocess
    import sys

    from tests import SCRIPTS
    from tests.conftest import subprocess_env

    best = next((fitted / "ckpt").glob("best-*.ckpt"))
    out = tmp_path / "inference.json"
    done = subprocess.run([sys.executable, str(SCRIPTS / "benchmark_inference.py"), "--ckpt", str(best), "--config",
                           str(CONFIGS / "digits.yaml"), "--runs", "1", "--min_seconds", "0", "--threads", "1",
                           "--skip", "onnx-int8 dynamic", "--json", str(out)],
                          capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    expected = ["torch", "onnx", "onnx-int8", "openvino", "openvino-int8"]
    if "bf16" in result["cpu_flags"]:
        expected[1:1] = ["torch autocast bf16", "torch-bf16", "torch-bf16 sdpa"]
    assert [r["backend"] for r in rows] == expected
    by_name = {r["backend"]: r for r in rows}
    assert by_name["torch"]["ratio_b8"] == 1.0 and by_name["torch"]["max_abs_diff"] == 0.0
    for name in ("onnx", "openvino"):
        assert by_name[name]["max_abs_diff"] < 1e-4 and by_name[name]["agree_fp32"] == 1.0
        # top-1 is scored on the 359 test digits: the exact backends get the same score
        assert by_name[name]["top1"] == by_name["torch"]["top1"]
    for r in rows:
        assert r["img_s_b1"] > 0 and r["img_s_b8"] > 0 and 0 <= r["top1"] <= 1
    assert result["fastest"]["exact"] in ("torch", "onnx", "openvino")
    printed = done.stdout
    assert "CPU flags:" in printed and "| openvino-int8 |" in printed and "fastest exact" in printed
