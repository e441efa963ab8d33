"""int8 ONNX models from an fp32 export: static (calibrated QDQ) and dynamic, by onnxruntime's quantiser.

* **static** (`quantize_static_int8`): the Linear layers (MatMul nodes with a weight: qkv, proj, fc1, fc2)
  get QuantizeLinear/DequantizeLinear pairs on their input (uint8, asymmetric, range from MinMax
  calibration on a few hundred training images through the eval transform) and on their weight (int8,
  symmetric, per output channel). onnxruntime and OpenVINO run those MatMuls in int8.
  What stays fp32: the patch embedding (Conv), the head (Gemm), both attention products (MatMuls of two
  activations) and Softmax, LayerNorm and GELU;
  `scripts/bench/benchmark_inference.py --int8_ablation` measures what quantising each of them costs and gains.
  ``reduce_range`` (7-bit weights) where the CPU lacks VNNI: see `vit.deploy.cpu.reduce_range_for`.
* **dynamic** (`quantize_dynamic_int8`): the same Linear layers, weights int8 per channel, activations
  quantised per batch at run time: no calibration, slower (onnxruntime only, MatMulInteger).

Both keep the model's metadata and add ``quantization`` (JSON: mode, reduce_range, calibration images).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.errors import UserPathError, UserValueError

CALIBRATION_IMAGES = 300  # MinMax ranges settle within a few hundred images (NNCF's default subset is 300)


CALIBRATION_BATCH = 16


KEEP_FP32 = ("patch_embed", "head", "attention")  # what `linear_matmuls` leaves out besides the Linear layers


@contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """Drop the quantiser's root-logger hint to run its shape-inference pre-processing: our export is already
    shape-inferred by torch's exporter, and `vit.deploy.export` checks every result against PyTorch."""

    def drop_hint(record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()

    logging.getLogger().addFilter(drop_hint)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(drop_hint)


def quantizable_nodes(proto: Any, keep_fp32: Sequence[str] = KEEP_FP32) -> list[str]:
    """Names of the nodes to quantise: the MatMuls with a weight initializer (the Linear layers), plus what
    ``keep_fp32`` does not name of the patch embedding (Conv), the head (Gemm) and the attention products."""
    weights = {init.name for init in proto.graph.initializer}
    chosen = []
    for node in proto.graph.node:
        has_weight = len(node.input) > 1 and node.input[1] in weights
        wanted = {"MatMul": has_weight or "attention" not in keep_fp32, "Conv": "patch_embed" not in keep_fp32,
                  "Gemm": "head" not in keep_fp32}
        if wanted.get(node.op_type, False):
            chosen.append(node.name)
    return chosen


def _with_metadata(quantized: Any, source: Any, quantization: dict[str, Any]) -> bytes:
    from vit.deploy.metadata import set_metadata

    set_metadata(quantized, {p.key: json.loads(p.value) for p in source.metadata_props})
    set_metadata(quantized, {"quantization": quantization})
    return quantized.SerializeToString()


def quantize_dynamic_int8(model: bytes) -> bytes:
    """Dynamic int8 quantisation of the Linear layers (MatMul nodes with a weight) by onnxruntime.

    Weights become int8 per output channel; activations are quantised per batch at run time. The attention
    products (both operands activations) and the head (Gemm) stay fp32. The metadata is kept.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    proto = onnx.load_from_string(model)
    with tempfile.TemporaryDirectory() as tmp, _quiet_quantizer():
        source, target = Path(tmp, "fp32.onnx"), Path(tmp, "int8.onnx")
        source.write_bytes(model)
        quantize_dynamic(source, target, op_types_to_quantize=["MatMul"], nodes_to_quantize=quantizable_nodes(proto),
                         per_channel=True, weight_type=QuantType.QInt8)
        quantized = onnx.load(target)
    return _with_metadata(quantized, proto, {"mode": "dynamic"})


def quantize_static_int8(model: bytes, images: Tensor, *, reduce_range: bool,
                         keep_fp32: Sequence[str] = KEEP_FP32) -> bytes:
    """Static QDQ int8 of ``model`` (fp32 ONNX bytes), its activation ranges calibrated on ``images`` (N, C, H, W)."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    if len(images) == 0:
        raise UserValueError("static int8 needs calibration images; none were given")
    proto = onnx.load_from_string(model)
    input_name = proto.graph.input[0].name
    batches = [images[i:i + CALIBRATION_BATCH].float().numpy() for i in range(0, len(images), CALIBRATION_BATCH)]

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(batches)

        def get_next(self) -> dict | None:
            batch = next(self.left, None)
            return None if batch is None else {input_name: batch}

    nodes = quantizable_nodes(proto, keep_fp32)
    with tempfile.TemporaryDirectory() as tmp, _quiet_quantizer():
        source, target = Path(tmp, "fp32.onnx"), Path(tmp, "int8.onnx")
        source.write_bytes(model)
        quantize_static(
            source, target, Batches(), quant_format=QuantFormat.QDQ, per_channel=True, reduce_range=reduce_range,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
            op_types_to_quantize=["MatMul", "Conv", "Gemm"], nodes_to_quantize=nodes,
            extra_options={"WeightSymmetric": True, "ActivationSymmetric": False},
        )
        quantized = onnx.load(target)
    return _with_metadata(quantized, proto, {"mode": "static", "reduce_range": reduce_range,
                                             "calibration_images": len(images), "keep_fp32": list(keep_fp32)})


# ---- calibration images ----------------------------------------------------------------------------
def calibration_images(source: str | os.PathLike, transform: Callable, mode: str,
                       count: int = CALIBRATION_IMAGES, seed: int = 0) -> Tensor:
    """Up to ``count`` images (N, C, H, W) for calibration, prepared by ``transform`` (the eval transform).

    ``source`` is a folder of images (its ``train/`` split when it has one, as `vit fit` reads it; searched
    recursively); `vit.cli.data.calibration_images` also takes a `vit fit` config. A random ``count`` of them, by
    ``seed``.
    """
    source = Path(source)
    if not source.is_dir():
        raise UserPathError(f"--calibration {source}: expected a folder of training images or a `vit fit` config "
                            "(.yaml), and found neither")
    from vit.data.io import find_images, has_split_folders, load_image

    root = source / "train" if has_split_folders(source) else source
    files = find_images([root]).files
    if not files:
        raise UserValueError(f"--calibration {source}: no image files in {root}")
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed))[:count]
    images = []
    for index in order.tolist():
        images.append(transform(load_image(files[index], mode)))  # as `vit predict` decodes it
    return torch.stack(images)
