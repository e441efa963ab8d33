"""scripts/bench/lora_memory_speed.py: what each arm trains, counted by hand, and its figures in one process (a tiny
ViT, one repeat: a smoke test, not a timing; the figures are in docs/finetune.md)."""

import pytest

from tests import load_script

MODEL, SMALL = "vit_tiny_patch16_224", dict(depth=2, img_size=32)  # 2 blocks of width 192; the head: 10 classes
HEAD = 192 * 10 + 10
LORA_QV = 2 * 2 * (8 * 192 + 192 * 8)  # two slices of qkv per block, A (8, 192) and B (192, 8) each
LORA_QKV = 2 * (8 * 192 + 3 * 192 * 8)  # the whole fused qkv: B (576, 8)


@pytest.fixture(scope="module")
def bench():
    return load_script("lora_memory_speed")


@pytest.mark.parametrize(("arm", "trainable"), [
    ("full", None), ("lora_qv", LORA_QV + HEAD), ("dora_qv", LORA_QV + 2 * 2 * 192 + HEAD),  # + DoRA's magnitudes
    ("lora_qkv", LORA_QKV + HEAD), ("peft_lora_qkv", LORA_QKV + HEAD), ("dora_qkv", LORA_QKV + 2 * 576 + HEAD),
    ("peft_dora_qkv", LORA_QKV + 2 * 576 + HEAD),
])
def test_each_arm_trains_its_adapters_and_head(bench, arm, trainable):
    model, params = bench.build(arm, MODEL, rank=8, **SMALL)
    total = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in params) == (trainable or total)
    assert all(p.requires_grad for p in params)


def test_one_arms_memory_and_state_bytes(bench):
    """AdamW holds two fp32 moments per trained value and one fp32 step count per trained tensor."""
    figures = bench.measure_memory("lora_qv", MODEL, batch_size=1, rank=8, **SMALL)
    assert figures["trainable"] == LORA_QV + HEAD
    assert figures["optimizer_bytes"] == 8 * figures["trainable"] + 4 * (2 * 2 * 2 + 2)
    assert figures["checkpoint_weights_bytes"] > 4 * figures["trainable"]  # the tensors and their names
    assert figures["checkpoint_bytes"] > figures["checkpoint_weights_bytes"] + figures["optimizer_bytes"]
    assert figures["peak_mib"] >= 0


def test_the_timed_arms_alternate_in_one_process_and_the_ratios_follow(bench):
    seconds = bench.measure_time(["full", "lora_qv", "peft_lora_qkv"], MODEL, batch_size=1, rank=8, repeats=1,
                                 **SMALL)
    assert set(seconds) == {"full", "lora_qv", "peft_lora_qkv"} and min(seconds.values()) > 0
    arms = {arm: {"optimizer_bytes": 8.0 * i, "peak_mib": 2.0 * i, "step_s": s}
            for i, (arm, s) in enumerate(seconds.items(), 1)}
    ratios = bench.ratios({"arms": arms})
    assert ratios["optimizer_share"] == 2 and ratios["peak_share"] == 2
    assert ratios["step_share"] == seconds["lora_qv"] / seconds["full"]
    assert ratios["lora_qv_vs_peft_lora_qkv"] == seconds["lora_qv"] / seconds["peft_lora_qkv"]


def test_the_arithmetic_for_big_models_counts_16_bytes_a_parameter_against_the_adapters(bench):
    (row,) = bench.arithmetic(8, ("vit_base_patch16_224",))
    params = 86_567_656 - (768 * 1000 + 1000)  # ViT-B/16 without its ImageNet head
    assert row["params"] == params and row["adapters"] == 12 * 2 * (8 * 768 + 768 * 8)
    assert row["full_bytes"] == 16 * params and row["lora_bytes"] == 4 * params + 16 * row["adapters"]
    assert row["lora_checkpoint_bytes"] == 12 * row["adapters"]
