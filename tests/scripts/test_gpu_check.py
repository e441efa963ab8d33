"""scripts/gpu/gpu_check.py, the prepared GPU run, smoke-tested on the CPU so it cannot rot unseen."""

import json

import pytest
import torch

from tests import load_script
from vit.data.digits import Digits
from vit.deploy import load_classifier


@pytest.mark.slow
def test_gpu_check_runs_every_step_on_cpu(tmp_path):
    gpu_check = load_script("gpu_check")
    report = gpu_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == report
    # the profiler saw torch's CPU flash kernel run for our attention, with no backend forced
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in report["attention"]["sdpa_kernels"]
    assert report["attention"]["flash_selected"] is True
    assert report["attention"]["max_abs_diff_fast_vs_explicit"] < 1e-4
    assert report["attention"]["max_abs_diff_causal"] < 1e-4
    assert {(r["mode"], r["precision"]) for r in report["eager"]} == {
        ("infer", "fp32"), ("train", "fp32"), ("infer", "bf16"), ("train", "bf16")
    }
    assert report["lightning"]["fit_seconds"] > 0
    # the FSDP step's code (DDP on a CPU): trained, saved, consolidated by `vit export --format ckpt` in another
    # process, equal to the trained weights; layer decay kept its decayed and undecayed groups
    fsdp = report["fsdp"]
    assert "error" not in fsdp and fsdp["strategy"] == "DDPStrategy" and fsdp["consolidated_max_abs_diff"] == 0
    assert fsdp["param_groups"] == 29 and fsdp["decayed_groups"] == 14  # ViT-tiny: 14 layers x 2 + head's 2 - 1

    # the reported test accuracy, recomputed from the saved weights outside Lightning (bf16 autocast, as in the fit)
    model = load_classifier(tmp_path / "digits.ckpt")
    data = Digits(img_size=16, batch_size=128, num_workers=0)
    data.setup("test")
    correct = total = 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for x, y in data.test_dataloader():
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    assert total == 359
    assert report["lightning"]["test_acc"] == pytest.approx(correct / total, abs=2 / total)


def test_gpu_check_needs_neither_jsonargparse_nor_wandb():
    """The GPU image lacks both: the script and what its steps import load without them."""
    import subprocess
    import sys

    from tests import script_path

    code = (
        "import sys; sys.modules['jsonargparse'] = None; sys.modules['wandb'] = None\n"
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('gpu_check', {str(script_path('gpu_check'))!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "import lightning.pytorch.strategies, vit.checkpoints.io, vit.data.digits, vit.tasks.classify\n"
        "import vit.tasks.optim\n"
        "from vit.commands import export\n"
        "export.parse_args(['--ckpt', 'x', '--format', 'ckpt', '--out', 'y'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
