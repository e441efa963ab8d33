"""Checks of what `vit.data.rows` infers from a labels table, each an error that names the rows and the option.

A table's layout is guessed when no option names it: the separator of several labels in a cell, whether the table
is multi-label, which columns hold the labels. A guess that hinges on a stray cell or a misspelt header trains the
wrong task (or dies after an epoch); these checks stop it before training, in a few lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from vit.errors import UserValueError, did_you_mean

MIN_MULTI_SHARE = 0.05  # under this share of rows with several labels, inferring multi-label is a guess to confirm
SHOWN = 5  # rows quoted in an error


def check_inferred_multi_label(path: Path, cells: Sequence[object], rows: Sequence[list[int] | None],
                               lines: Sequence[int]) -> None:
    """An error when a few rows alone would make a single-label table multi-label (``data.multi_label`` null):
    ``rows`` are each row's class indices (None: a bad row), ``cells`` the label cells they came from."""
    several = [i for i, row in enumerate(rows) if row is not None and len(row) != 1]
    labelled = sum(row is not None for row in rows)
    if not several or len(several) >= MIN_MULTI_SHARE * labelled:
        return
    shown = "\n".join(f"  line {lines[i]}: {cells[i]!r}" for i in several[:SHOWN])
    more = f"\n  ... and {len(several) - SHOWN} more" if len(several) > SHOWN else ""
    raise UserValueError(
        f"{path}: {len(several):,} of {labelled:,} rows hold several labels (or none), so the table would be read "
        f"as multi-label:\n{shown}{more}\nSay which it is: data.multi_label: false to train one label per image "
        "(these rows are then bad rows: fix them, or add data.skip_bad_rows: true), or data.multi_label: true to "
        "train several labels per image (configs/multilabel_cpu.yaml)")


def check_mixed_separators(path: Path, cells: Sequence[object], separator: str, separators: Sequence[str],
                           lines: Sequence[int]) -> None:
    """An error when, after splitting by the ``separator`` found, a label still holds another of ``separators``
    (``a;b`` on one line, ``c,d,e`` on another): the cells mix separators, and ``c,d,e`` would be one class."""
    others = [s for s in separators if s and s != separator]
    first: dict[str, int] = {}  # each distinct cell's first row: a big table holds a few thousand
    for i, cell in enumerate(cells):
        if isinstance(cell, str):
            first.setdefault(cell, i)
    if not any(s in "\n".join(first) for s in others):
        return
    for cell, i in first.items():
        part = next((p.strip() for p in (cell.split(separator) if separator else [cell]) for s in others if s in p),
                    None)
        if part is None:
            continue
        used = next((c for c in first if separator and separator in c), None)
        joined = f"{separator!r} (line {lines[first[used]]}: {used!r}) and " if used is not None else ""
        other = next(s for s in others if s in part)
        raise UserValueError(
            f"{path}: the label cells mix separators: {joined}{other!r} (line {lines[i]}: {cell!r}), so {part!r} "
            "would be one class's name. Join every cell's labels with one separator, or name it with data.separator "
            "(a class name may then hold the others)")


def check_per_class_columns(path: Path, names: Sequence[str], cells: Sequence[Sequence[object]],
                            values: Mapping[object, int], label_names: Sequence[str], rows: int = 100) -> None:
    """An error when a column taken as a per-class 0/1 column (no label column was found) holds no 0/1 value in
    its first ``rows`` rows: it is a label column under another name (``lable``, ``species``)."""
    head = cells[:rows]
    for j, name in enumerate(names):
        column = [c.strip() if isinstance(c, str) else c for row in head if row is not None for c in row[j:j + 1]]
        filled = [c for c in column if c not in (None, "")]  # blank is "unknown" in a per-class column
        if not filled or any(c in values for c in filled):
            continue
        hint = did_you_mean(name.lower(), label_names)
        raise UserValueError(
            f"{path} has no label column ({', '.join(label_names[:3])}, ...), and column {name!r} is no per-class "
            f"0/1 column: it holds {filled[0]!r}{hint}. Rename it, or name it with data.label_column {name}")
