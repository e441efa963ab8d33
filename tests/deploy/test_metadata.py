"""The ONNX file's metadata (`vit.deploy.metadata`): what prediction needs, written by `vit export`."""

from __future__ import annotations

import json

import onnx

from vit.deploy import load_classifier
from vit.deploy.metadata import METADATA_KEYS


def test_onnx_metadata_holds_what_prediction_needs(exported):
    classifier = load_classifier(exported.ckpt)
    for path in (exported.onnx, exported.onnx_int8):
        meta = {p.key: json.loads(p.value) for p in onnx.load(path).metadata_props if p.key in METADATA_KEYS}
        assert meta == {
            "model_name": "vit_digits_patch4_16", "class_names": [str(i) for i in range(10)], "img_size": [16, 16],
            "in_chans": 1, "mean": list(classifier.mean), "std": list(classifier.std), "crop_pct": 1.0,
            "interpolation": "bilinear",
        }


def test_load_proto_reads_a_file_or_bytes_and_says_none_for_anything_else(exported, tmp_path):
    from vit.deploy.metadata import load_proto

    names = [p.key for p in onnx.load(exported.onnx).metadata_props]
    assert [p.key for p in load_proto(exported.onnx).metadata_props] == names
    assert [p.key for p in load_proto(exported.onnx.read_bytes()).metadata_props] == names
    (tmp_path / "x.onnx").write_text("not a model")
    assert load_proto(tmp_path / "x.onnx") is None and load_proto(b"\xff\x00") is None
