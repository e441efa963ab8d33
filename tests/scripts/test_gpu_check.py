"""scripts/gpu_check.py, the prepared GPU run, smoke-tested on the CPU so it cannot rot unseen."""

import importlib.util
import json

import pytest

from tests import SCRIPTS

SCRIPT = SCRIPTS / "gpu_check.py"


@pytest.mark.slow
def test_gpu_check_runs_every_step_on_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    report = gpu_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == report
    assert report["attention"]["flash_sdpa"] == "ok"
    assert report["attention"]["max_abs_diff_fast_vs_explicit"] < 1e-4
    assert report["attention"]["max_abs_diff_causal"] < 1e-4
    assert {(r["mode"], r["precision"]) for r in report["eager"]} == {
        ("infer", "fp32"), ("train", "fp32"), ("infer", "bf16"), ("train", "bf16")
    }
    assert report["lightning"]["fit_seconds"] > 0 and 0 <= report["lightning"]["test_acc"] <= 1
