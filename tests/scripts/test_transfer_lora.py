"""scripts/experiments/transfer_lora.py runs its six arms end to end (tiny settings: a smoke test; the figures are in
docs/finetune.md), each training what it should, counted by hand for the digits ViT (4 blocks of width 64, 5
classes), and a second run reuses the backbone the first one kept."""

import json

import pytest

from tests import load_script

HEAD = 64 * 5 + 5
LORA = 4 * 2 * 64 * 2  # per rank: q and v in each of 4 blocks, A (r, 64) and B (64, r)
# per rank, every linear layer of 4 blocks: q, k, v and proj 64 -> 64, fc1 64 -> 128, fc2 128 -> 64
ALL_LINEAR = 4 * (4 * (64 + 64) + 2 * (64 + 128))
# the digits ViT: a 4x4 patch of 1 channel to 64, cls, 17 positions, 4 blocks (2 norms, qkv, proj, MLP ratio 2), a norm
FULL = (16 * 64 + 64) + 64 + 17 * 64 + 4 * (2 * 128 + (64 * 192 + 192) + (64 * 64 + 64) + (64 * 128 + 128)
                                            + (128 * 64 + 64)) + 128 + HEAD


@pytest.mark.slow
def test_transfer_lora_reports_every_arm_with_its_cost(tmp_path):
    transfer = load_script("transfer_lora")
    out = tmp_path / "transfer.json"
    backbone = tmp_path / "backbone.ckpt"
    args = ["--pretrain_epochs", "1", "--steps", "2", "--seeds", "1", "--backbone", str(backbone)]
    summary = transfer.main([*args, "--json", str(out)])
    assert json.loads(out.read_text()) == summary
    trains = {"full": FULL, "linear probe": HEAD, "LoRA r=8": 8 * LORA + HEAD, "LoRA r=8 all": 8 * ALL_LINEAR + HEAD,
              "LoRA r=1": LORA + HEAD, "DoRA r=8": 8 * LORA + 4 * 2 * 64 + HEAD}  # DoRA: a magnitude per adapted row
    assert {m: r["trainable"] for m, r in summary.items()} == trains
    for method, r in summary.items():
        assert r["runs"] == [r["mean"]] and r["stdev"] == 0
        assert all(abs(v * 179 - round(v * 179)) < 1e-4 for v in r["runs"])  # a count of the 179 test digits 5-9
        assert r["gradients"] == 4 * r["trainable"] and r["optimizer"] == 8 * r["trainable"]
        assert r["weights"] == 4 * (FULL + (r["trainable"] - HEAD if method not in ("full", "linear probe") else 0))
        assert r["fit_s"] > 0 and r["lrs"][0] in transfer.METHODS[method][1]
    # a frozen backbone saves nothing for backward but the head's input; the others save the blocks' activations
    assert summary["linear probe"]["activations"] < summary["LoRA r=8"]["activations"] / 100
    # a second run finds the backbone the first one kept, and an arm scores as it did beside the others
    again = transfer.main([*args, "--pretrain_epochs", "2", "--methods", "LoRA r=1"])
    assert [again["LoRA r=1"][k] for k in ("runs", "lrs")] == [summary["LoRA r=1"][k] for k in ("runs", "lrs")]
