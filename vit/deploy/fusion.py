"""onnxruntime's fused attention for our ONNX exports, by onnxscript's ORT fusions.

torch's exporter writes our attention (`vit.nn.attention`, one packed qkv Linear and SDPA) as MatMul, Mul,
Softmax and MatMul. onnxruntime's own optimiser (``optimize_model(model_type="vit")``) fuses attention only
for three separate Q/K/V MatMuls with a Div scale, so it matches neither. onnxscript's rewriter
(``onnxscript.rewriter.ort_fusions.optimize_for_ort``) knows the exporter's SDPA shape: it rewrites each block's
attention into one ``com.microsoft.MultiHeadAttention`` node (and LayerNorm + residual into
``SkipLayerNormalization``, bias + GELU into ``BiasGelu``).

The fused graph runs only in onnxruntime, so files keep the standard ops (OpenVINO and others read them) and
`vit.deploy.inference.OnnxClassifier` fuses when it loads one: static int8 gains from it, fp32 is as fast either
way (docs/inference.md, "fused attention").
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

log = logging.getLogger(__name__)
ATTENTION_OPS = ("MultiHeadAttention", "Attention")  # onnxruntime's fused attention kernels (com.microsoft)


def fusion_available() -> bool:
    """Whether onnxscript (the `export` extra) is there to fuse."""
    return importlib.util.find_spec("onnxscript") is not None


def fuse_attention(proto: Any) -> tuple[bytes, dict[str, int]]:
    """``proto`` (an ONNX ModelProto) with onnxruntime's fusions applied, serialised; and how many of each.

    The metadata is kept. A graph the rewriter cannot handle is returned unchanged (and logged): fusion is a
    speed-up, never a reason to stop.
    """
    from onnxscript import ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    try:
        model, counts = optimize_for_ort(ir.from_proto(proto))
        fused = ir.to_proto(model)
    except Exception as e:  # (the rewriter's errors are its own; the unfused model still runs)
        log.warning("onnxruntime attention fusion skipped: %s: %s", type(e).__name__, e)
        return proto.SerializeToString(), {}
    del fused.metadata_props[:]
    fused.metadata_props.extend(proto.metadata_props)
    return fused.SerializeToString(), {k: v for k, v in counts.items() if v}


def attention_nodes(proto: Any) -> int:
    """How many fused attention nodes an ONNX ModelProto holds."""
    return sum(n.op_type in ATTENTION_OPS for n in proto.graph.node)
