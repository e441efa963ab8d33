"""`vit serve`'s arguments (`vit.commands.serve`); the server itself is tested in tests/serve/."""

from __future__ import annotations

import pytest


def test_serve_takes_the_same_backends():
    from vit.commands import serve

    assert serve.parse_args(["--ckpt", "model.int8.onnx", "--backend", "openvino-int8"]).backend == "openvino-int8"
    assert serve.parse_args(["--ckpt", "last.ckpt"]).backend is None  # torch for a checkpoint, as before
    with pytest.raises(SystemExit):
        serve.parse_args(["--ckpt", "last.ckpt", "--backend", "tensorrt"])
