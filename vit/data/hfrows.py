"""A Hugging Face dataset's rows as vit's labels table: labels encoded column-wise, image bytes from Arrow buffers.

```
splits (pyarrow Tables) ─► labels per split (pyarrow.compute, no Python row objects) ─► LabelTable: paths = row numbers
                        └► ArrowImageColumn: each row's image bytes, sliced from the Arrow buffers (numpy views)
```
A row's number counts over the splits in order (train, val, test); `RowNames` turns it back into "train row 12".
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vit.data.hf import HFSource, _class_names, image_column, label_column, read_split, table_features
from vit.data.rows import BadRow, LabelTable
from vit.errors import UserValueError


class ArrowImageColumn:
    """Each row's encoded image, zero-copy: per Arrow chunk, its offsets and data buffers as numpy arrays.

    Rows whose bytes are null but whose path names a file (an Image feature saved by path) read that file."""

    def __init__(self, chunks: Sequence[Any], paths: dict[int, str]) -> None:
        self.offsets, self.data, starts = [], [], [0]
        for chunk in chunks:
            buffers = chunk.buffers()
            wide = np.int64 if str(chunk.type).startswith("large") else np.int32
            self.offsets.append(np.frombuffer(buffers[1], dtype=wide)[chunk.offset:chunk.offset + len(chunk) + 1])
            self.data.append(np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None
                             else np.zeros(0, np.uint8))
            starts.append(starts[-1] + len(chunk))
        self.starts = np.asarray(starts, dtype=np.int64)
        self.paths = paths

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, row: int) -> np.ndarray | str:
        """Row ``row``'s encoded bytes (a uint8 view of the Arrow buffer), or the path of its file."""
        if row in self.paths:
            return self.paths[row]
        k = int(np.searchsorted(self.starts, row, side="right")) - 1
        offsets, i = self.offsets[k], row - int(self.starts[k])
        return self.data[k][int(offsets[i]):int(offsets[i + 1])]


class RowNames:
    """A row number's name in the data: its split and row within it ("validation row 7")."""

    def __init__(self, names: Sequence[str], lengths: Sequence[int]) -> None:
        self.names, self.starts = list(names), np.cumsum([0, *lengths])

    def __call__(self, row: int) -> str:
        k = int(np.searchsorted(self.starts, row, side="right")) - 1
        return f"{self.names[k]} row {row - int(self.starts[k])}"


def _image_chunks(column: Any, folder: Path, start: int, paths: dict[int, str], bad: dict[int, BadRow]) -> list:
    """The bytes chunks of an image column (a struct of bytes and path, or plain binary); rows without bytes read
    their path's file (relative to ``folder``), or are bad."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chunks, row = [], start
    for chunk in column.chunks:
        struct = pa.types.is_struct(chunk.type)
        data = chunk.field("bytes") if struct else chunk
        if data.null_count:
            files = chunk.field("path") if struct and chunk.type.get_field_index("path") >= 0 else None
            for i in np.flatnonzero(data.is_null().to_numpy(zero_copy_only=False)).tolist():
                file = files[i].as_py() if files is not None else None
                full = None if file is None else file if os.path.isabs(file) else str(folder / file)
                if full and os.path.isfile(full):
                    paths[row + i] = full
                else:
                    gone = f" and no file {file}" if file else ""
                    bad[row + i] = BadRow(row + i, "missing image", f"no image bytes{gone}")
        if pc.any(pc.equal(pc.binary_length(data), 0)).as_py():
            for i in np.flatnonzero(pc.equal(pc.binary_length(data), 0).to_numpy(zero_copy_only=False)).tolist():
                bad.setdefault(row + i, BadRow(row + i, "missing image", "0 bytes"))
        chunks.append(data)
        row += len(chunk)
    return chunks


def _names_from_data(columns: Sequence[Any], classes: Sequence[str] | None) -> list[str]:
    """The class names: ``classes``, else every label seen (as text), sorted as the folder path sorts its folders."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if classes is not None:
        return list(classes)
    seen: set[str] = set()
    for column in columns:
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            column = pc.list_flatten(column)
        seen |= {v for v in pc.unique(column.cast(pa.string())).to_pylist() if v not in (None, "")}
    return sorted(seen)


def _codes(column: Any, names: list[str] | None, class_label: list[str] | None) -> np.ndarray:
    """Class indices of a flat column: ClassLabel ints as they are (-1 stays -1), else text looked up in ``names``
    (-1 for null or empty, -2 for a name outside them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if class_label is not None:  # ints into the feature's names, then into ``names`` (data.classes) where they differ
        codes = column.fill_null(-1).to_numpy().astype(np.int64)
        codes[(codes < -1) | (codes >= len(class_label))] = -2
        if names != class_label:
            lookup = np.asarray([names.index(n) if n in names else -2 for n in class_label], dtype=np.int64)
            codes[codes >= 0] = lookup[codes[codes >= 0]]
        return codes
    text = column.cast(pa.string())
    found = pc.index_in(text, value_set=pa.array(names, pa.string())).fill_null(-2).to_numpy().astype(np.int64)
    empty = pc.or_(pc.is_null(text), pc.equal(text, "")).fill_null(True).to_numpy(zero_copy_only=False)
    found[empty] = -1
    return found


def _encode(column: Any, names: list[str], class_label: list[str] | None, multi: bool, start: int,
            bad: dict[int, BadRow]) -> tuple[np.ndarray, np.ndarray | None]:
    """One split's labels: (N,) class indices, or for multi-label (N, C) int8 targets; bad rows noted."""
    import pyarrow.compute as pc

    column = column.combine_chunks()
    if not multi:
        codes = _codes(column, names, class_label)
        for i in np.flatnonzero(codes < 0).tolist():
            value = column[i].as_py()
            bad.setdefault(start + i, BadRow(start + i, "empty label", "no label") if codes[i] == -1 else
                           BadRow(start + i, "unknown class", f"{value!r} is none of the {len(names)} classes"))
        return codes, None
    targets = np.zeros((len(column), len(names)), dtype=np.int8)
    flat = _codes(pc.list_flatten(column), names, class_label)
    parents = pc.list_parent_indices(column).to_numpy().astype(np.int64)
    ok = flat >= 0
    targets[parents[ok], flat[ok]] = 1
    for i in sorted(set(parents[~ok].tolist())):
        bad.setdefault(start + i, BadRow(start + i, "unknown class", f"{column[i].as_py()!r} holds a label that is "
                                                                     f"none of the {len(names)} classes"))
    for i in np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)).tolist():
        bad.setdefault(start + i, BadRow(start + i, "empty label", "no labels (null)"))
    return np.full(len(column), -1, dtype=np.int64), targets


def read_hf(source: HFSource, *, image_column_name: str | None = None, label_column_name: str | None = None,
            classes: Sequence[str] | None = None, multi_label: bool | None = None
            ) -> tuple[LabelTable, ArrowImageColumn, RowNames]:
    """The rows of every split as one `LabelTable` (paths: row numbers), the images' bytes, and the rows' names."""
    import pyarrow as pa

    tables = {name: read_split(files) for name, files in source.splits.items()}
    first = next(iter(tables.values()))
    features = source.features or table_features(first)
    where = f"{source.name} ({source.folder})"
    image = image_column(first, features, image_column_name, where)
    label = label_column(first, features, label_column_name, image, where)
    class_label = _class_names(features.get(label))
    kind = first.schema.field(label).type
    multi = pa.types.is_list(kind) or pa.types.is_large_list(kind) or bool(multi_label)
    if multi_label is False and multi:
        raise UserValueError(f"{where}: column {label!r} holds lists of labels, and data.multi_label is false")
    names = class_label if class_label is not None and classes is None else \
        _names_from_data([t.column(label) for t in tables.values()], classes)
    bad: dict[int, BadRow] = {}
    paths: dict[int, str] = {}
    chunks, labels, targets, split_of, start = [], [], [], [], 0
    for name, table in tables.items():
        if image not in table.column_names or label not in table.column_names:
            raise UserValueError(f"{where}: split {name} lacks column {image!r} or {label!r}; its columns: "
                                 f"{table.column_names}")
        chunks += _image_chunks(table.column(image), source.folder, start, paths, bad)
        codes, hot = _encode(table.column(label), names, class_label, multi, start, bad)
        labels.append(codes)
        targets.append(hot)
        split_of += [name] * len(table)
        start += len(table)
    images = ArrowImageColumn(chunks, paths)
    rows = RowNames(list(tables), [len(t) for t in tables.values()])
    return _table(source, names, np.concatenate(labels), np.concatenate(targets) if multi else None,
                  split_of if len(tables) > 1 else None, bad, f"image {image!r}, labels {label!r}", rows), images, rows


def _table(source: HFSource, names: list[str], labels: np.ndarray, targets: np.ndarray | None,
           splits: list[str] | None, bad: dict[int, BadRow], how: str, rows: RowNames) -> LabelTable:
    """The usable rows as a `LabelTable`, single-label rows ordered by class (stably: the data's order within a
    class), as ImageFolder lists a class-folder tree, so the seeded split and its order are the folder path's."""
    keep = np.asarray([i for i in range(len(labels)) if i not in bad], dtype=np.int64)
    if targets is None:
        keep = keep[np.argsort(labels[keep], kind="stable")]
    for b in bad.values():
        b.detail = f"{rows(b.line)}: {b.detail}"
    return LabelTable(
        source.folder, names, keep.tolist(), None if targets is not None else labels[keep].tolist(),
        None if targets is None else targets[keep], None if splits is None else [splits[i] for i in keep],
        sorted(bad.values(), key=lambda b: b.line), 0, how)


def by_row(b: BadRow) -> str:
    """A bad row of a Hugging Face split, named by its split and row (the detail starts with them)."""
    return b.detail.replace(": ", f": {b.kind}: ", 1)
