"""The instruction-set choices of `vit.deploy.cpu` (flags mocked): int8's reduce_range and torch-bf16's attention
path."""

from __future__ import annotations

import pytest

import vit.deploy.cpu
from tests.deploy.conftest import AMX, AVX_VNNI, NO_VNNI, VNNI, ZEN4, agrees, logits
from vit.deploy import load_classifier


@pytest.mark.parametrize(("flags", "reduce"), [(NO_VNNI, True), (VNNI, False), (AVX_VNNI, False), (AMX, False),
                                               (ZEN4, False), (None, True)])
def test_reduce_range_follows_the_instruction_set(monkeypatch, flags, reduce):
    monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda: flags)
    assert vit.deploy.cpu.reduce_range_for() is reduce


@pytest.mark.parametrize("flags, fused", [(AMX, True), (ZEN4, False)])
def test_bf16_attention_path_follows_the_instruction_set(trained, monkeypatch, flags, fused):
    """Without AMX (AMD Zen 4) torch-bf16 computes attention as two bf16 matmuls, twice as fast there as SDPA's bf16
    kernel; with AMX SDPA stays. Either way the same top-1 as eager fp32 on the test digits."""
    from vit.nn.attention import MultiHeadAttention

    monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda: flags)
    model = load_classifier(trained["ckpt"], backend="torch-bf16")
    paths = {m.fused_attn for m in model.modules() if isinstance(m, MultiHeadAttention)}
    assert paths == {fused}
    eager = logits(load_classifier(trained["ckpt"]), trained["images"])
    assert agrees(logits(model, trained["images"]), eager, exact=False)
