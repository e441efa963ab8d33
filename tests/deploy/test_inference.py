"""The ONNX runner (`vit.deploy.inference`): an export or its folder given where the other goes is named as such."""

from __future__ import annotations

import pytest


def test_an_onnx_export_or_its_folder_given_where_the_other_goes_is_named_as_such(tmp_path):
    """`vit attention --ckpt model.onnx` was told the ONNX file was a checkpoint damaged by a kill, and
    `vit predict --ckpt` of the export's folder that it was not found."""
    from vit.checkpoints.io import read_checkpoint
    from vit.deploy.inference import OnnxClassifier

    onnx = tmp_path / "export" / "model.onnx"
    onnx.parent.mkdir()
    onnx.write_bytes(b"\x08\x08\x12\x07pytorch")  # an ONNX protobuf starts with its ir_version field
    with pytest.raises(ValueError, match=r"model\.onnx is an ONNX export.*needs the \.ckpt"):
        read_checkpoint(onnx)
    with pytest.raises(FileNotFoundError, match=r"export is a folder, not an ONNX model; give the file in it"):
        OnnxClassifier(onnx.parent)
