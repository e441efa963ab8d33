"""Static int8 (`vit.deploy.quantize`): the calibrated file's structure, calibration that breaks the agreement, 7-bit
weights without VNNI, and the calibration images drawn from a folder or a config."""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import vit.deploy.cpu
from tests.deploy.conftest import NO_VNNI, VNNI, agrees, logits
from vit.deploy import backends, load_classifier
from vit.deploy.quantize import quantize_static_int8


def test_broken_calibration_loses_the_agreement(trained):
    """A model calibrated on zeros fails the agreement the test above checks (it kept top-1 on 99.7% of the digits:
    LayerNorm gives the quantised layers inputs of a realistic scale even then, but the logits move 0.8)."""
    classifier = load_classifier(trained["ckpt"])
    eager = logits(classifier, trained["images"])
    broken = quantize_static_int8(onnx.load(trained["fp32"]).SerializeToString(), torch.zeros(32, 1, 16, 16),
                                  reduce_range=False)
    got = logits(backends.OnnxClassifier(broken, 1), trained["images"])
    assert not agrees(got, eager, exact=False)


def metadata(path) -> dict:
    """Our metadata entries of an ONNX file (JSON), without the quantiser's own."""
    return {p.key: json.loads(p.value) for p in onnx.load(path).metadata_props
            if p.key in ("quantization", "class_names")}


def producers(graph) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output}


def test_static_int8_quantises_the_linear_layers_and_keeps_the_rest_fp32(trained):
    graph = onnx.load(trained["int8"]).graph
    made_by = producers(graph)
    weights = {init.name for init in graph.initializer}

    def dequantized(name: str) -> bool:  # fed by DequantizeLinear (of an activation, or of an int8 weight)
        return name in made_by and made_by[name].op_type == "DequantizeLinear"

    kinds: dict[str, list[bool]] = {}
    for node in graph.node:
        if node.op_type in ("MatMul", "Conv", "Gemm", "Softmax"):
            weight = made_by.get(node.input[1]) if len(node.input) > 1 else None
            linear = node.op_type == "MatMul" and weight is not None and weight.input[0] in weights
            kind = "linear" if linear else f"{node.op_type}{' activations' if node.op_type == 'MatMul' else ''}"
            kinds.setdefault(kind, []).append(all(dequantized(i) for i in node.input[:2]))
    # digits model, depth 4: 15 Linear layers (qkv, proj, fc1, fc2 of the first three blocks; proj, fc1, fc2 of the
    # last) int8. fp32: the patch embedding, the head, softmax, two attention products a block, and the last
    # block's q and kv: it computes the cls query alone, and the exporter leaves their weights as a Transpose of
    # a Slice of its qkv weight, which is not an initializer the quantiser sees (a 1-token q, one kv of 4 blocks)
    assert kinds == {"linear": [True] * 15, "MatMul activations": [False] * 10, "Conv": [False], "Gemm": [False],
                     "Softmax": [False] * 4}
    meta = metadata(trained["int8"])
    assert meta["quantization"]["mode"] == "static" and meta["quantization"]["calibration_images"] == 300
    assert meta["class_names"] == [str(i) for i in range(10)]  # the preprocessing metadata survives
    assert "calibrated on 300 images" in trained["printed"]


def test_export_without_vnni_writes_7_bit_weights(trained, monkeypatch, tmp_path):
    """The weights of a file exported on a CPU without VNNI stay within 7 bits (onnxruntime's saturation fix);
    a VNNI CPU's use all 8. Read from the int8 initializers themselves."""
    classifier = load_classifier(trained["ckpt"])
    from vit.deploy.export import export_onnx

    largest = {}
    for name, flags in (("no_vnni", NO_VNNI), ("vnni", VNNI)):
        monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda flags=flags: flags)
        export_onnx(classifier, tmp_path / name, quantize="static", calibration=trained["images"][:16])
        proto = onnx.load(tmp_path / name / "model.int8.onnx")
        int8 = [numpy_helper.to_array(t) for t in proto.graph.initializer if t.data_type == onnx.TensorProto.INT8]
        largest[name] = max(int(np.abs(w.astype(np.int32)).max()) for w in int8)
        assert metadata(tmp_path / name / "model.int8.onnx")["quantization"]["reduce_range"] is (name == "no_vnni")
    assert largest == {"no_vnni": 64, "vnni": 127}
    # and running the 8-bit file on a CPU without VNNI warns
    monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda: NO_VNNI)
    with pytest.warns(UserWarning, match=r"quantised for a CPU with VNNI .* no VNNI"):
        load_classifier(tmp_path / "vnni" / "model.int8.onnx", backend="onnx-int8")
    # OpenVINO's int8 without VNNI ran slower than fp32 eager on an AVX2 EPYC: said, with the faster backend
    with pytest.warns(UserWarning, match=r"openvino-int8 on a CPU without VNNI \(avx2 avx512f\).*onnx-int8 runs"):
        load_classifier(tmp_path / "no_vnni" / "model.int8.onnx", backend="openvino-int8")
    monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda: VNNI)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with VNNI, neither warning
        load_classifier(tmp_path / "vnni" / "model.int8.onnx", backend="openvino-int8")
        load_classifier(tmp_path / "vnni" / "model.int8.onnx", backend="onnx-int8")


def test_calibration_from_a_folder_is_a_random_draw_through_the_eval_transform(trained, digit_pngs, tmp_path):
    from PIL import Image

    from vit.deploy.quantize import calibration_images

    files = digit_pngs[0][:30]
    (tmp_path / "train" / "a").mkdir(parents=True)
    for f in files:
        (tmp_path / "train" / "a" / f.name).symlink_to(f)
    (tmp_path / "unrelated.png").symlink_to(digit_pngs[0][-1])  # outside train/: not drawn
    transform = load_classifier(trained["ckpt"]).eval_transform()
    drawn = calibration_images(tmp_path, transform, "L", count=12)
    assert drawn.shape == (12, 1, 16, 16)
    every = torch.stack([transform(Image.open(f).convert("L")) for f in files])
    matches = [(every == image).flatten(1).all(1).nonzero().flatten().tolist() for image in drawn]
    assert all(len(m) >= 1 for m in matches) and len({m[0] for m in matches}) == 12  # 12 different files
    torch.testing.assert_close(calibration_images(tmp_path, transform, "L", count=12), drawn)  # seeded


def test_calibration_from_a_folder_with_a_class_named_train_draws_from_every_class(trained, digit_pngs, tmp_path):
    from vit.deploy.quantize import calibration_images

    for name, files in (("train", digit_pngs[0][:3]), ("zebra", digit_pngs[0][3:43])):  # no split layout
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f.name).symlink_to(f)
    transform = load_classifier(trained["ckpt"]).eval_transform()
    assert len(calibration_images(tmp_path, transform, "L", count=12)) == 12  # not the 3 images of "train"
