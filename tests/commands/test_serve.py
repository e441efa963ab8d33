"""`vit serve`'s arguments (`vit.commands.serve`); the server itself is tested in tests/serve/."""

from __future__ import annotations
import contextlib
import io
import json
import warnings
import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
import vit.deploy.cpu
from tests import CONFIGS
from vit.commands import main, run
from vit.deploy import backends, load_classifier
from vit.deploy.backends import UnsupportedBackendError
from vit.deploy.fusion import attention_nodes, fuse_attention
from vit.deploy.quantize import quantize_static_int8
from vit.errors import MissingPackageError


def test_serve_takes_the_same_backends():
    from vit.commands import serve

    assert serve.parse_args(["--ckpt", "model.int8.onnx", "--backend", "openvino-int8"]).backend == "openvino-int8"
    assert serve.parse_args(["--ckpt", "last.ckpt"]).backend is None  # torch for a checkpoint, as before
    with pytest.raises(SystemExit):
        serve.parse_args(["--ckpt", "last.ckpt", "--backend", "tensorrt"])
