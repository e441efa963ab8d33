"""Fused attention in the ONNX graph (`vit.deploy.fusion`): onnxscript's ORT fusions, counted in the graph, same
logits."""

from __future__ import annotations

import onnx
import torch

from vit.deploy import backends, load_classifier
from vit.deploy.fusion import attention_nodes, fuse_attention


def test_onnxruntime_fuses_every_blocks_attention(trained):
    """onnxscript's ORT fusions turn each block's attention into one MultiHeadAttention: counted in the fused graph
    (4 blocks), with the same logits, and that is the graph `--backend onnx` runs."""
    proto = onnx.load(trained["fp32"])
    assert attention_nodes(proto) == 0
    fused, counts = fuse_attention(proto)
    assert counts["sdpa"] == 4  # what onnxscript says it fused; the graph below says what it holds
    fused_proto = onnx.load_from_string(fused)
    assert attention_nodes(fused_proto) == 4
    assert not any(n.op_type == "Softmax" for n in fused_proto.graph.node)  # all of it inside the fused kernel
    model = load_classifier(trained["fp32"], backend="onnx")
    assert model.fused.get("sdpa") == 4
    plain = backends.OnnxClassifier(trained["fp32"], fuse=False)
    x = trained["images"][:8]
    torch.testing.assert_close(model(x), plain(x), atol=1e-5, rtol=0)
