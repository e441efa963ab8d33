"""A labels table read without Lightning: CSV, TSV or JSONL rows of an image path and its labels.

    table ─► records (line, cells) ─► checked rows ─► LabelTable
                                       │                paths (N,) ─ joined to the table's folder unless absolute
                                       │                labels (N,) int          (single-label)
                                       │                targets (N, C) int8      (multi-label: 1, 0, or -1 unknown)
                                       │                splits (N,) or None      (a `split` column)
                                       └─ BadRow(line, kind, detail): reported at setup, a few lines, never a traceback

Labels come as one cell per row (one label, or several joined by a separator: ``red;cotton``; in JSONL a list), or
as one 0/1 column per class, where blank or -1 is "unknown" (CheXpert's way). Built for ImageNet-sized tables:
plain strings and lists per row, and one directory listing per folder to find missing files, never a stat per row.
"""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np

from vit.data.row_checks import check_inferred_multi_label, check_mixed_separators, check_per_class_columns
from vit.errors import UserPathError, UserValueError

# Column names found without options, in this order (Hugging Face's imagefolder says file_name).
PATH_COLUMNS = ("file_name", "path", "image", "filepath", "filename", "image_path", "file", "img")
LABEL_COLUMNS = ("label", "labels", "tags", "class", "category")
SPLITS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
HF_TABLES = ("metadata.csv", "metadata.jsonl")  # found beside the images without options
TABLE_SUFFIXES = (".csv", ".tsv", ".tab", ".jsonl", ".ndjson")
SEPARATORS = (";", "|", ",")  # tried in order when no separator is given; a space must be asked for
UNKNOWN = -1
# A per-class cell: 1 or 0, and blank or -1 (CheXpert's "uncertain") for unknown. JSON's true/false and 1.0/0.0/-1.0
# hash as 1/0/-1, so the numbers' keys serve them too.
CELL_VALUES = {"1": 1, "0": 0, "": UNKNOWN, "-1": UNKNOWN, "1.0": 1, "0.0": 0, "-1.0": UNKNOWN, "true": 1,
               "false": 0, "True": 1, "False": 0, 1: 1, 0: 0, -1: UNKNOWN, None: UNKNOWN}
SHOWN = 6  # bad rows listed by line: with the count, "... and N more" and the fix, 9 lines


@dataclass
class BadRow:
    """A row that cannot be used: its line in the table (1 is the CSV header), what is wrong, and the detail."""

    line: int
    kind: str  # missing file, unknown class, empty label, conflicting duplicate, outside root, malformed
    detail: str


@dataclass
class LabelTable:
    """The usable rows of a labels table, and the bad ones."""

    path: Path
    class_names: list[str]
    paths: list[str]
    labels: list[int] | None  # single-label: a class index per row
    targets: np.ndarray | None  # multi-label: (N, C) int8, 1 / 0 / -1 (unknown)
    splits: list[str] | None  # "train" / "val" / "test" per row, from the split column
    bad: list[BadRow] = field(default_factory=list)
    repeated: int = 0  # rows repeating an earlier one with the same labels, kept once
    how: str = ""  # which columns gave what, for the setup log

    @property
    def multi_label(self) -> bool:
        """Whether the labels are per-class targets rather than one class per row."""
        return self.targets is not None


def find_table(root: Path, table: str | None) -> Path:
    """The table of ``root``: ``table`` (relative to ``root`` unless absolute), else HF's ``metadata.csv`` or
    ``metadata.jsonl``; an error in one line naming the option when ``root`` holds another table."""
    if table is not None:
        path = Path(table).expanduser()
        path = path if path.is_absolute() else root / path
        if not path.is_file():
            raise UserPathError(f"labels table not found: {path}")
        return path
    found = [root / name for name in HF_TABLES if (root / name).is_file()]
    if len(found) == 2:
        raise UserValueError(f"{root} holds both metadata.csv and metadata.jsonl: name one with "
                             "--data.init_args.table")
    if found:
        return found[0]
    others = tables_in(root)
    if others:
        raise UserPathError(f"{root} has no metadata.csv or metadata.jsonl; name its table with "
                            f"--data.init_args.table {others[0]}")
    raise UserPathError(f"{root} holds no labels table: put a metadata.csv (file_name,label) beside the images, "
                        "or name one with --data.init_args.table FILE")


def tables_in(folder: Path) -> list[str]:
    """The names of the files in ``folder`` that look like labels tables (CSV, TSV, JSONL), sorted."""
    try:
        with os.scandir(folder) as entries:
            return sorted(e.name for e in entries if e.is_file() and e.name.lower().endswith(TABLE_SUFFIXES)
                          and not e.name.startswith("."))
    except OSError:
        return []


def _records(path: Path) -> tuple[list[str], Iterator[tuple[int, list | None]]]:
    """The header and the (line, cells) of each row; cells None for a malformed line (wrong field count, bad
    JSON). CSV lines count as the file shows them (a quoted cell may span lines); the header is line 1."""
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return _json_records(path)
    handle = path.open(newline="", encoding="utf-8-sig")  # Excel's CSVs start with a byte-order mark
    reader = csv.reader(handle, delimiter="\t" if path.suffix.lower() in (".tsv", ".tab") else ",")
    header = next(reader, None)
    if header is None:
        handle.close()
        raise UserValueError(f"{path} is empty: expected a header line such as file_name,label")
    header = [h.strip() for h in header]

    def rows() -> Iterator[tuple[int, list | None]]:
        width = len(header)
        with handle:
            while True:
                try:
                    for cells in reader:
                        if len(cells) == width:
                            yield reader.line_num, cells
                        elif any(cells):  # a blank line is no row
                            yield reader.line_num, None
                    return
                except csv.Error:  # (a NUL byte, an unclosed quote at the end): that line, and read on
                    yield reader.line_num, None
    return header, rows()


def _json_records(path: Path) -> tuple[list[str], Iterator[tuple[int, list | None]]]:
    """JSONL: one object per line; the columns are the first object's keys (a missing key is a blank cell)."""
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    objects = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            obj = None
        objects.append((number, obj if isinstance(obj, dict) else None))
    header = next((list(obj) for _, obj in objects if obj is not None), None)
    if header is None:
        raise UserValueError(f"{path} holds no JSON object per line: expected lines such as "
                             '{"file_name": "a.jpg", "label": "cat"}')
    return header, ((n, None if obj is None else [obj.get(k) for k in header]) for n, obj in objects)


def _column(header: Sequence[str], given: str | None, defaults: Sequence[str], option: str, path: Path) -> int | None:
    """The index of the column ``given`` (an error when absent), else of the first default present, else None."""
    folded = {h.lower(): i for i, h in reversed(list(enumerate(header)))}
    if given is not None:
        if given.lower() not in folded:
            raise UserValueError(f"{path} has no column {given!r} (data.{option}); its columns: {list(header)}")
        return folded[given.lower()]
    return next((folded[d] for d in defaults if d in folded), None)


def _label_columns(path: Path, header: Sequence[str], taken: tuple[int | None, ...], label_column: str | None,
                   label_columns: Sequence[str] | None) -> tuple[list[int], bool]:
    """The label columns' indices, and whether they are per-class 0/1 columns (rather than one label cell)."""
    if label_columns is not None:
        return [_column(header, name, (), "label_columns", path) for name in label_columns], True
    if (li := _column(header, label_column, LABEL_COLUMNS, "label_column", path)) is not None:
        return [li], False
    others = [i for i in range(len(header)) if i not in taken]  # no label column: one 0/1 column per class
    if not others:
        raise UserValueError(f"{path} has no label column: expected one of {', '.join(LABEL_COLUMNS[:3])} "
                             "(or data.label_column), or one 0/1 column per class")
    return others, True


def _cell_names(cell: object, separator: str) -> list[str] | None:
    """The label names of one cell (a list in JSONL), or None when the cell is empty."""
    if isinstance(cell, list):
        return [str(x).strip() for x in cell if str(x).strip()]
    text = "" if cell is None else str(cell).strip()
    if not text:
        return None
    if not separator:
        return [text]
    names = [n.strip() for n in text.split(separator)]
    return list(dict.fromkeys(n for n in names if n))


def _separator(cells: Sequence[object], separator: str | None) -> str:
    """The separator given, else the first of `SEPARATORS` that occurs in a cell ("" for none)."""
    if separator is not None:
        return separator
    texts = "\n".join({c for c in cells if isinstance(c, str)})  # a few thousand distinct cells, at most
    return next((s for s in SEPARATORS if s in texts), "")


def read_table(
    path: Path, *, path_column: str | None = None, label_column: str | None = None,
    label_columns: Sequence[str] | None = None, separator: str | None = None, classes: Sequence[str] | None = None,
    multi_label: bool | None = None, split_column: str | None = "split", check_files: bool = True,
    root: Path | None = None,
) -> LabelTable:
    """Read and check a labels table (see the module's docstring); bad rows are listed in ``.bad``, not raised.
    A relative path that leads out of ``root`` (the table's folder by default) is a bad row; absolute paths are
    taken as they are."""
    header, records = _records(path)
    pi = _column(header, path_column, PATH_COLUMNS, "path_column", path)
    if pi is None:
        raise UserValueError(f"{path} has no image path column: expected one of {', '.join(PATH_COLUMNS[:3])}, or "
                             f"name it with data.path_column; its columns: {header}")
    si = _column(header, None, (split_column,), "split_column", path) if split_column else None
    label_idx, per_class = _label_columns(path, header, (pi, si), label_column, label_columns)
    bad: dict[int, BadRow] = {}
    lines, path_cells, label_cells, split_cells = [], [], [], []
    for line, cells in records:
        if cells is None:
            bad[len(lines)] = BadRow(line, "malformed", f"not a row of the header's {len(header)} columns")
            cells = [None] * len(header)
        lines.append(line)
        path_cells.append(cells[pi])
        label_cells.append(cells[label_idx[0]] if not per_class else [cells[i] for i in label_idx])
        split_cells.append(cells[si] if si is not None else None)
    paths = _resolve_paths(path.parent, root or path.parent, path_cells, lines, bad, check_files)
    if per_class:
        names = [header[i] for i in label_idx]
        if classes is not None and list(classes) != names:
            raise UserValueError(f"{path}: data.classes {list(classes)} differ from its per-class columns {names}")
        if label_columns is None:  # inferred: a label column under another name is no 0/1 column
            check_per_class_columns(path, names, label_cells, CELL_VALUES, LABEL_COLUMNS)
        targets = _per_class_targets(label_cells, lines, bad)
        how = f"{len(names)} per-class columns (blank or -1: unknown)"
        table_labels: list | None = None
    else:
        names, table_labels, targets, how = _cell_targets(path, header[label_idx[0]], label_cells, separator, classes,
                                                          multi_label, lines, bad)
    splits = _splits(split_cells, lines, bad) if si is not None else None
    _check_duplicates(paths, table_labels if targets is None else targets, splits, lines, bad)
    keep = _in_order([i for i, p in enumerate(paths) if p is not None and i not in bad], paths,
                     table_labels if targets is None else None)
    repeated = len(lines) - len(keep) - len(bad)
    return LabelTable(
        path, names, [paths[i] for i in keep],
        None if targets is not None else [table_labels[i][0] for i in keep],
        None if targets is None else targets[keep], None if splits is None else [splits[i] for i in keep],
        sorted(bad.values(), key=lambda b: b.line), repeated, how)


def _cell_targets(
    path: Path, column: str, label_cells: list, separator: str | None, classes: Sequence[str] | None,
    multi_label: bool | None, lines: list[int], bad: dict[int, BadRow],
) -> tuple[list[str], list, np.ndarray | None, str]:
    """Labels from one column of cells: (class names, each row's label list, multi-hot targets or None for
    single-label, how the labels were read). Rows a single-label table cannot take are added to ``bad``."""
    sep = _separator(label_cells, separator)
    if separator is None:
        check_mixed_separators(path, label_cells, sep, SEPARATORS, lines)
    names, table_labels = _cell_labels(label_cells, sep, classes, lines, bad)
    if multi_label is None:
        check_inferred_multi_label(path, label_cells, table_labels, lines)
    targets = None
    how = f"labels in column {column!r}" + (f", separated by {sep!r}" if sep else "")
    several = any(len(x) != 1 for x in table_labels if x is not None)  # (a JSONL [] is no label at all)
    if multi_label is False and several:
        for i, x in enumerate(table_labels):
            if x is not None and len(x) != 1 and i not in bad:
                bad[i] = (BadRow(lines[i], "empty label", "an empty list of labels") if not x else
                          BadRow(lines[i], "malformed", f"{len(x)} labels, and data.multi_label is false"))
    elif multi_label or several:
        targets = _multi_hot(table_labels, len(names))
    return names, table_labels, targets, how


def _in_order(keep: list[int], paths: Sequence[str | None], labels: Sequence | None) -> list[int]:
    """The rows ``keep`` in one order whatever the table's: by class then path, as ImageFolder lists a class-folder
    tree (so the seeded split takes the same images), or by path for multi-label rows (``labels`` None)."""
    keep = sorted(keep, key=paths.__getitem__)
    if labels is None:
        return keep
    # then by class, stably: numpy's stable argsort beats a sort on (class, path) tuples
    return np.asarray(keep, dtype=np.int64)[np.argsort([labels[i][0] for i in keep], kind="stable")].tolist()


def _resolve_paths(folder: Path, root: Path, cells: Sequence[object], lines: Sequence[int], bad: dict[int, BadRow],
                   check_files: bool) -> list[str | None]:
    """Each row's image path, joined to the table's ``folder`` unless absolute, as `os.path.join` writes it (so a
    table listing a class-folder tree names the files as `ImageFolder` does); None for a bad row. Missing files are
    found from one listing per folder."""
    base, inside = str(folder), os.path.normpath(os.path.abspath(root)) + "/"
    prefix = base if base.endswith("/") else base + "/"  # os.path.join(base, p) for a relative p, at a string's cost
    texts = [c.strip() if isinstance(c, str) else "" for c in cells]
    paths: list[str | None] = [prefix + t for t in texts]  # the common case, in one pass; odd rows redone below
    blob = "\n" + "\n".join(texts) + "\n"
    if any(mark in blob for mark in ("\\", "/.", "//", "\n.", "\n/", "\n\n")):
        for i, text in enumerate(texts):
            if not text or text[0] in "./" or "\\" in text or "/." in text or "//" in text:
                paths[i] = _odd_path(text, prefix, inside, root, lines[i], i, bad)
    if check_files:
        parents = {p.rpartition("/")[0] for p in paths if p is not None}
        existing = {f"{parent}/{name}" for parent in parents for name in _listing(parent)}
        for i in [i for i, p in enumerate(paths) if p is not None and p not in existing]:
            bad.setdefault(i, BadRow(lines[i], "missing file", paths[i]))
    return paths


def _odd_path(text: str, prefix: str, inside: str, root: Path, line: int, i: int, bad: dict[int, BadRow]
              ) -> str | None:
    """The path of a row that needs care: empty, absolute, with ``.`` or ``..`` parts, ``//`` or Windows' ``\\``;
    None (and a bad row) when it is empty or leads out of ``root``."""
    if not text:
        bad.setdefault(i, BadRow(line, "malformed", "no image path"))
        return None
    given = text
    if "\\" in text and os.sep == "/":  # a table written on Windows
        text = text.replace("\\", "/")
    if text[0] == "." or "/." in text or "//" in text:
        text = os.path.normpath(text)
    if text[0] == "/":
        return text
    full = prefix + text
    if ".." in text:
        full = os.path.normpath(full)
        if not (os.path.abspath(full) + "/").startswith(inside):
            bad.setdefault(i, BadRow(line, "outside root", f"{given} leads out of {root}"))
            return None
    return full


def _listing(folder: str) -> set[str]:
    """The names in ``folder`` (none when it is missing): one call per folder, where a stat per row would be slow."""
    try:
        return set(os.listdir(folder or "/"))
    except OSError:
        return set()


def _cell_labels(cells: Sequence[object], separator: str, classes: Sequence[str] | None, lines: Sequence[int],
                 bad: dict[int, BadRow]) -> tuple[list[str], list[list[int] | None]]:
    """The class names (``classes``, else every name seen, sorted) and each row's class indices (None: bad)."""
    parsed: dict[str, list[str] | None] = {}  # a table of a million rows holds a few thousand distinct cells
    names = [(parsed[c] if c in parsed else parsed.setdefault(c, _cell_names(c, separator)))
             if isinstance(c, str) else _cell_names(c, separator) for c in cells]
    class_names = list(classes) if classes is not None else sorted({n for row in names if row for n in row})
    index = {name: i for i, name in enumerate(class_names)}
    rows: list[list[int] | None] = []
    found_for: dict[int, list[int | None]] = {}  # by the parsed list's identity: one lookup per distinct cell
    for i, row in enumerate(names):
        if row is None:
            bad.setdefault(i, BadRow(lines[i], "empty label", "the label cell is empty"))
            rows.append(None)
            continue
        found = found_for.get(id(row))
        if found is None:
            found = found_for[id(row)] = [index.get(n) for n in row]
        if None in found:
            unknown = [n for n, k in zip(row, found) if k is None]
            bad.setdefault(i, BadRow(lines[i], "unknown class", f"{unknown[0]!r} is not in data.classes"))
            rows.append(None)
            continue
        rows.append(found)
    return class_names, rows


def _multi_hot(rows: Sequence[list[int] | None], num_classes: int) -> np.ndarray:
    """(N, C) int8 targets: 1 for each row's labels, 0 elsewhere (a cell lists what applies; the rest does not)."""
    targets = np.zeros((len(rows), num_classes), dtype=np.int8)
    lengths = np.fromiter((len(row) if row else 0 for row in rows), dtype=np.int64, count=len(rows))
    columns = np.fromiter(chain.from_iterable(row for row in rows if row), dtype=np.int64, count=int(lengths.sum()))
    targets[np.repeat(np.arange(len(rows)), lengths), columns] = 1
    return targets


def _per_class_targets(cells: Sequence[list], lines: Sequence[int], bad: dict[int, BadRow]) -> np.ndarray:
    """(N, C) int8 targets from 0/1 columns: 1, 0, or -1 where the cell is blank or -1 (unknown)."""
    targets = np.full((len(cells), len(cells[0]) if cells else 0), UNKNOWN, dtype=np.int8)
    for i, row in enumerate(cells):
        values = [CELL_VALUES.get(c.strip() if isinstance(c, str) else c, 2) for c in row]
        if 2 in values:
            cell = row[values.index(2)]
            bad.setdefault(i, BadRow(lines[i], "malformed", f"{cell!r} in a per-class column: expected 1, 0, "
                                                            "or blank / -1 for unknown"))
            continue
        targets[i] = values
    return targets


def _splits(cells: Sequence[object], lines: Sequence[int], bad: dict[int, BadRow]) -> list[str]:
    """Each row's split (train / val / test; valid and validation are val); a bad row for any other value."""
    out = []
    for i, cell in enumerate(cells):
        split = SPLITS.get(str(cell).strip().lower()) if cell is not None else None
        if split is None:
            bad.setdefault(i, BadRow(lines[i], "malformed", f"split {cell!r} is none of train, val, test"))
        out.append(split or "train")
    return out


def _check_duplicates(paths: list[str | None], labels: Sequence | np.ndarray, splits: Sequence[str] | None,
                      lines: Sequence[int], bad: dict[int, BadRow]) -> None:
    """A path listed again with the same labels (and split) is kept once (its repeat's path set to None); with
    other labels, or in another split, both rows are bad."""
    listed = [p for p in paths if p is not None]
    if len(set(listed)) == len(listed):  # no path twice: nothing to compare (the common case, in one pass)
        return
    first: dict[str, int] = {}
    for i, path in enumerate(paths):
        if path is None or i in bad:
            continue
        j = first.setdefault(os.path.normpath(path) if "/." in path else path, i)
        if j == i:
            continue
        same = (labels[i] == labels[j]) if not isinstance(labels, np.ndarray) else np.array_equal(labels[i], labels[j])
        if same and (splits is None or splits[i] == splits[j]):
            paths[i] = None
            continue
        what = "other labels" if not same else f"split {splits[i]} (line {lines[j]}: {splits[j]})"
        bad[i] = BadRow(lines[i], "conflicting duplicate", f"{path} is also on line {lines[j]}, with {what}")
        bad.setdefault(j, BadRow(lines[j], "conflicting duplicate", f"{path} is also on line {lines[i]}, "
                                                                    f"with {what}"))


def by_line(b: BadRow) -> str:
    """A bad row of a table file, named by its line."""
    return f"line {b.line}: {b.kind}: {b.detail}"


def describe_bad_rows(table: Path | str, bad: Sequence[BadRow], total: int, row: Callable[[BadRow], str] = by_line
                      ) -> str:
    """A count per kind and the first bad rows, each named by ``row`` (by line number): at most 9 lines (the caller
    adds the fix)."""
    kinds = Counter(b.kind for b in bad)
    lines = [f"{table}: {len(bad):,} of {total:,} rows are bad ("
             + ", ".join(f"{n:,} {kind}" for kind, n in kinds.most_common()) + "):"]
    lines += [f"  {row(b)}" for b in bad[:SHOWN]]
    if len(bad) > SHOWN:
        lines.append(f"  ... and {len(bad) - SHOWN:,} more")
    return "\n".join(lines)
