"""`vit.hashing.digest`: a value's bytes, type and shape go into the hash, so equal bytes of another shape differ."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from vit.hashing import digest


def hashed(value) -> str:
    h = hashlib.sha256()
    digest(h, value)
    return h.hexdigest()


def test_a_tensor_hashes_its_dtype_shape_and_bytes():
    x = torch.arange(6, dtype=torch.float32)
    by_hand = hashlib.sha256(b"torch.float32(6,)" + np.arange(6, dtype=np.float32).tobytes()).hexdigest()
    assert hashed(x) == by_hand
    assert hashed(x.reshape(2, 3)) != hashed(x)  # the same bytes in another shape
    turned = x.reshape(2, 3).t()
    assert hashed(turned) == hashed(turned.contiguous())  # the values in order, whatever the memory layout
    assert hashed(x.to(torch.int32)) != hashed(x)


def test_an_array_and_a_json_value_hash_as_written_out():
    a = np.arange(4, dtype=np.int64).reshape(2, 2)
    assert hashed(a) == hashlib.sha256(b"int64(2, 2)" + a.tobytes()).hexdigest()
    assert hashed(np.asfortranarray(a)) == hashed(a)  # the values in C order, whatever the memory layout
    assert hashed({"b": 1, "a": [1, 2]}) == hashlib.sha256(b'{"a": [1, 2], "b": 1}').hexdigest()  # keys sorted
