"""A Hugging Face dataset's rows (vit.data.hfrows): image bytes sliced from the Arrow buffers equal pyarrow's own
values across chunks and slices; labels encoded column-wise equal a per-row reading."""

from __future__ import annotations

import numpy as np
import pytest

from vit.data.hfrows import ArrowImageColumn, RowNames, _codes

pa = pytest.importorskip("pyarrow")


@pytest.mark.parametrize("large", [False, True])
def test_a_rows_bytes_are_pyarrows_value_across_chunks_and_sliced_chunks(large):
    kind = pa.large_binary() if large else pa.binary()
    rng = np.random.default_rng(0)
    values = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8)) for n in rng.integers(0, 50, 40)]
    whole = pa.array(values, type=kind)
    chunks = [whole.slice(0, 7), whole.slice(7, 20), whole.slice(27)]  # slices: non-zero offsets into one buffer
    column = ArrowImageColumn(chunks, {})
    assert len(column) == 40
    assert all(bytes(column[i]) == values[i] for i in range(40))
    assert ArrowImageColumn(chunks, {5: "/a.png"})[5] == "/a.png"


def test_labels_encode_as_a_per_row_lookup_does():
    names = ["cat", "dog", "owl"]
    cells = ["dog", None, "owl", "", "emu", "cat"]
    expected = [names.index(c) if c in names else (-1 if not c else -2) for c in cells]
    assert _codes(pa.array(cells), names, None).tolist() == expected
    ints = pa.array([2, None, 0, 7, -1])  # a ClassLabel column: -1 and null are no label, 7 is out of range
    assert _codes(ints, names, names).tolist() == [2, -1, 0, -2, -1]
    assert _codes(ints, ["owl", "cat"], names).tolist() == [0, -1, 1, -2, -1]  # onto data.classes by name
    rows = RowNames(["train", "val"], [3, 2])
    assert [rows(i) for i in range(5)] == ["train row 0", "train row 1", "train row 2", "val row 0", "val row 1"]
