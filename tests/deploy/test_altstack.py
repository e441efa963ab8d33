"""`vit.deploy.altstack`: the thread's alternate signal stack is the one it had before an OpenVINO compile, and the
context manager restores a stack replaced inside it (read back with sigaltstack, not with the code under test's
own record)."""

from __future__ import annotations

import ctypes
import gc
import sys

import pytest
import torch

from tests.helpers import TINY_DIM
from vit.deploy.altstack import kept_signal_stack, signal_stack

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sigaltstack is read on Linux")


def install_stack(size: int = 1 << 16) -> ctypes.Array:
    """Give this thread a new alternate signal stack of ``size`` bytes (the buffer must outlive its use)."""
    from vit.deploy.altstack import _libc, _Stack

    buffer = ctypes.create_string_buffer(size)
    assert _libc().sigaltstack(ctypes.byref(_Stack(ctypes.addressof(buffer), 0, size)), None) == 0
    return buffer


@pytest.fixture(autouse=True)
def _the_tests_own_stacks_undone():
    with kept_signal_stack():  # these tests install stacks of their own (conftest's check fails a test that leaves one)
        yield


def test_a_stack_replaced_in_the_block_is_given_back():
    kept = install_stack()
    before = signal_stack()
    assert before == (ctypes.addressof(kept), 0, 1 << 16)
    with kept_signal_stack():
        other = install_stack(1 << 15)
        assert signal_stack() == (ctypes.addressof(other), 0, 1 << 15)
    assert signal_stack() == before


def test_an_openvino_model_leaves_the_threads_stack_as_it_was():
    pytest.importorskip("openvino")
    from vit.deploy.backends import OpenVinoClassifier

    kept = install_stack()
    before = signal_stack()
    import vit
    from vit.deploy.classifier import Classifier
    from vit.deploy.export import exact_onnx

    model = vit.create_model("vit_digits_patch4_16", num_classes=3, depth=1, embed_dim=TINY_DIM, num_heads=2)
    classifier = Classifier(model.eval(), model_name="tiny", class_names=["a", "b", "c"], mean=(0.5,), std=(0.5,),
                            crop_pct=1.0, interpolation="bilinear")
    model = OpenVinoClassifier(exact_onnx(classifier))
    model(torch.zeros(1, 1, 16, 16))
    assert signal_stack() == before  # without the guard: OpenVINO's own, unmapped once the model is freed
    del model
    gc.collect()
    assert signal_stack() == before and ctypes.addressof(kept)
