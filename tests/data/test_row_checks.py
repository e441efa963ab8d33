"""The checks of what `vit.data.rows` infers from a labels table (`vit.data.row_checks`): a stray list cell, cells
mixing two separators, a misspelt label column; each an error naming the rows and the option, before training."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data.test_rows import images, write_csv
from vit.data.row_checks import MIN_MULTI_SHARE, check_inferred_multi_label
from vit.data.rows import read_table
from vit.errors import UserValueError


def test_one_stray_list_cell_among_single_labels_is_an_error_naming_its_line_and_data_multi_label(tmp_path):
    """1 of 100 rows with two labels: no silent multi-label run (it died after the first validation); the error
    names the line and both choices. At 5 of 100 rows (the share that counts as multi-label data) it is inferred."""
    files = images(tmp_path, 100)
    labels = ["zero", "six"] * 50
    rows = [["file_name", "label"], *map(list, zip(files, labels))]
    rows[18][1] = "zero, six"
    with pytest.raises(UserValueError) as stray:
        read_table(write_csv(tmp_path / "t.csv", rows))
    text = str(stray.value)
    assert "1 of 100 rows hold several labels" in text and "line 19: 'zero, six'" in text
    assert "data.multi_label: false" in text and "data.multi_label: true" in text and len(text.splitlines()) <= 10
    single = read_table(tmp_path / "t.csv", multi_label=False)  # the stray row is a bad row, as the error says
    assert not single.multi_label and [(b.line, b.kind) for b in single.bad] == [(19, "malformed")]
    assert read_table(tmp_path / "t.csv", multi_label=True).multi_label
    for i in (2, 3, 4, 5):  # 5 of 100 rows with several labels: multi-label data, inferred
        rows[i][1] = "zero;six"
    rows[18][1] = "zero;six"
    table = read_table(write_csv(tmp_path / "t.csv", rows))
    assert table.multi_label and table.targets[:, :].sum() == 105
    rows[18][1] = "zero"  # 4 of 100: under the share, an error again
    with pytest.raises(UserValueError, match="4 of 100 rows hold several labels"):
        read_table(write_csv(tmp_path / "t.csv", rows))


def test_cells_mixing_two_separators_are_an_error_naming_both_lines_unless_the_separator_is_given(tmp_path):
    """``a;b`` and ``five,eight,nine`` in one table trained 150 classes named like ``five,eight,nine``."""
    files = images(tmp_path, 4)
    rows = [["file_name", "label"], [files[0], "five;eight"], [files[1], "nine"], [files[2], "five,eight,nine"],
            [files[3], "eight"]]
    with pytest.raises(UserValueError) as mixed:
        read_table(write_csv(tmp_path / "t.csv", rows))
    text = str(mixed.value)
    assert "mix separators: ';' (line 2: 'five;eight') and ',' (line 4: 'five,eight,nine')" in text
    assert "'five,eight,nine' would be one class's name" in text and "data.separator" in text
    assert len(text.splitlines()) == 1
    given = read_table(tmp_path / "t.csv", separator=";")  # named: a class name may hold a comma
    assert "five,eight,nine" in given.class_names
    rows[3][1] = "five;eight;nine"  # one separator throughout: read as before
    assert read_table(write_csv(tmp_path / "t.csv", rows)).class_names == ["eight", "five", "nine"]


def test_a_misspelt_label_column_gets_a_did_you_mean_not_a_thousand_malformed_rows(tmp_path):
    files = images(tmp_path, 4)
    write_csv(tmp_path / "t.csv", [["file_name", "lable"], *([f, c] for f, c in zip(files, "abab"))])
    with pytest.raises(UserValueError) as typo:
        read_table(tmp_path / "t.csv")
    text = str(typo.value)
    assert "column 'lable' is no per-class 0/1 column: it holds 'a' (did you mean 'label'?)" in text
    assert "data.label_column lable" in text and len(text.splitlines()) == 1
    assert read_table(tmp_path / "t.csv", label_column="lable").labels == [0, 0, 1, 1]
    write_csv(tmp_path / "p.csv", [["file_name", "lable", "b"], *([f, "1", ""] for f in files)])
    assert read_table(tmp_path / "p.csv").class_names == ["lable", "b"]  # a 0/1 column under any name is a class


def test_the_multi_label_share_is_a_bar_with_two_sides():
    """Rows with several labels at the share MIN_MULTI_SHARE of the labelled rows make multi-label data (no error);
    one row fewer is a stray cell (an error); a bad row (None) counts neither way."""
    n = 200
    several = int(MIN_MULTI_SHARE * n)
    rows = [[0, 1]] * several + [[0]] * (n - several) + [None]
    cells = ["a;b"] * several + ["a"] * (n - several) + [None]
    check_inferred_multi_label(Path("t.csv"), cells, rows, list(range(2, n + 3)))  # at the share: no error
    rows[0], cells[0] = [0], "a"
    with pytest.raises(UserValueError, match=f"t.csv: {several - 1} of {n} rows hold several labels"):
        check_inferred_multi_label(Path("t.csv"), cells, rows, list(range(2, n + 3)))
