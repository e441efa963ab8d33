"""Reading a labels table (vit.data.rows): the formats, the columns found without options, the two forms of labels,
and every bad row with its line number, checked against tables written here by hand (csv, json)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import random_images
from vit.data.rows import describe_bad_rows, find_table, read_table
from vit.errors import UserPathError, UserValueError


def write_csv(path: Path, rows: list[list[object]], delimiter: str = ",") -> Path:
    with path.open("w", newline="") as f:
        csv.writer(f, delimiter=delimiter).writerows(rows)
    return path


def images(root: Path, n: int = 6) -> list[str]:
    """``n`` images under root/images/, as the table names them (relative to root)."""
    return [f"images/{p.name}" for p in random_images(root / "images", n, mode="RGB")]


def test_single_label_csv_paths_join_the_tables_folder_and_rows_take_class_then_path_order(tmp_path):
    files = images(tmp_path)
    labels = ["dog", "cat", "dog", "cat", "bird", "cat"]
    table = read_table(write_csv(tmp_path / "labels.csv", [["file_name", "label"], *zip(files, labels)]))
    assert table.class_names == ["bird", "cat", "dog"] and not table.multi_label and table.splits is None
    expected = sorted((["bird", "cat", "dog"].index(c), str(tmp_path / f)) for f, c in zip(files, labels))
    assert list(zip(table.labels, table.paths)) == expected
    assert table.bad == [] and table.repeated == 0


def test_tsv_jsonl_and_an_excel_byte_order_mark_read_alike(tmp_path):
    files = images(tmp_path, 4)
    labels = ["a", "b", "a", "b"]
    write_csv(tmp_path / "t.tsv", [["path", "class"], *zip(files, labels)], delimiter="\t")
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps({"image": f, "label": c}) for f, c in zip(files, labels)))
    (tmp_path / "bom.csv").write_text("\ufeffFile_Name,Label\n" + "".join(f"{f},{c}\n" for f, c in zip(files, labels)),
                                      encoding="utf-8")
    read = [read_table(tmp_path / name) for name in ("t.tsv", "t.jsonl", "bom.csv")]
    assert all(t.paths == read[0].paths and t.labels == read[0].labels == [0, 0, 1, 1] for t in read)


def test_several_labels_in_a_cell_by_the_separator_found_given_or_none(tmp_path):
    files = images(tmp_path, 3)
    write_csv(tmp_path / "t.csv", [["file_name", "tags"], [files[0], "red;cotton"], [files[1], "red"],
                                   [files[2], " cotton ; sleeveless"]])
    table = read_table(tmp_path / "t.csv")
    assert table.multi_label and table.class_names == ["cotton", "red", "sleeveless"]
    assert table.targets.tolist() == [[1, 1, 0], [0, 1, 0], [1, 0, 1]] and table.targets.dtype == np.int8
    spaced = read_table(write_csv(tmp_path / "s.csv", [["file_name", "tags"], [files[0], "red cotton"],
                                                       [files[1], "red"]]), separator=" ")
    assert spaced.class_names == ["cotton", "red"] and spaced.targets.tolist() == [[1, 1], [0, 1]]
    whole = read_table(tmp_path / "t.csv", separator="")  # no separator: "red;cotton" is one class's name
    assert "red;cotton" in whole.class_names and not whole.multi_label


def test_per_class_columns_blank_and_minus_one_are_unknown(tmp_path):
    files = images(tmp_path, 4)
    write_csv(tmp_path / "chexpert.csv", [["Path", "Edema", "Effusion", "split"],
                                          [files[0], "1.0", "", "train"], [files[1], "0.0", "-1.0", "train"],
                                          [files[2], "1", "0", "valid"], [files[3], "-1", "1", "test"]])
    table = read_table(tmp_path / "chexpert.csv")
    assert table.multi_label and table.class_names == ["Edema", "Effusion"]
    assert table.targets.tolist() == [[1, -1], [0, -1], [1, 0], [-1, 1]] and table.splits == ["train", "train", "val",
                                                                                                "test"]
    lines = [{"file_name": files[0], "a": 1, "b": None}, {"file_name": files[1], "a": 0, "b": True}]
    (tmp_path / "m.jsonl").write_text("\n".join(map(json.dumps, lines)))
    assert read_table(tmp_path / "m.jsonl").targets.tolist() == [[1, -1], [0, 1]]


def test_jsonl_lists_and_an_empty_list_is_an_image_with_no_label(tmp_path):
    files = images(tmp_path, 2)
    (tmp_path / "m.jsonl").write_text(json.dumps({"file_name": files[0], "labels": ["x", "y"]}) + "\n\n"
                                      + json.dumps({"file_name": files[1], "labels": []}) + "\n")
    table = read_table(tmp_path / "m.jsonl")
    assert table.multi_label and table.targets.tolist() == [[1, 1], [0, 0]]


def test_multi_label_inferred_only_from_several_labels_and_forced_either_way(tmp_path):
    files = images(tmp_path, 2)
    write_csv(tmp_path / "one.csv", [["file_name", "label"], [files[0], "a"], [files[1], "b"]])
    assert not read_table(tmp_path / "one.csv").multi_label
    forced = read_table(tmp_path / "one.csv", multi_label=True)
    assert forced.multi_label and forced.targets.tolist() == [[1, 0], [0, 1]]
    write_csv(tmp_path / "two.csv", [["file_name", "label"], [files[0], "a;b"], [files[1], "b"]])
    single = read_table(tmp_path / "two.csv", multi_label=False)
    assert not single.multi_label and [(b.line, b.kind) for b in single.bad] == [(2, "malformed")]


def test_columns_named_by_option_and_a_missing_one_named_with_the_header(tmp_path):
    files = images(tmp_path, 2)
    write_csv(tmp_path / "t.csv", [["img_id", "breed", "notes"], [files[0], "a", "x"], [files[1], "b", "y"]])
    table = read_table(tmp_path / "t.csv", path_column="img_id", label_column="breed")
    assert table.labels == [0, 1]
    with pytest.raises(UserValueError, match=r"no column 'kind' \(data.label_column\); its columns: \['img_id'"):
        read_table(tmp_path / "t.csv", path_column="img_id", label_column="kind")
    write_csv(tmp_path / "u.csv", [["picture", "label"], [files[0], "a"]])
    with pytest.raises(UserValueError, match=r"no image path column.*data\.path_column"):
        read_table(tmp_path / "u.csv")


def test_a_csv_line_number_counts_a_quoted_cell_over_two_lines(tmp_path):
    files = images(tmp_path, 3)
    (tmp_path / "t.csv").write_text(f'file_name,label,note\n{files[0]},a,"two\nlines"\n{files[1]},b,x\n'
                                    f"{files[2]},,y\n")
    table = read_table(tmp_path / "t.csv")
    assert [(b.line, b.kind) for b in table.bad] == [(5, "empty label")]


@pytest.mark.parametrize(("line", "kind"), [
    ("images/nothere.png,a", "missing file"),
    (",a", "malformed"),
    ("{f},", "empty label"),
    ("../outside.png,a", "outside root"),
    ("{f},a,extra", "malformed"),
    ("{f},b", "conflicting duplicate"),
])
def test_each_bad_row_is_found_with_its_line(tmp_path, line, kind):
    files = images(tmp_path, 4)
    (tmp_path.parent / "outside.png").write_bytes((tmp_path / files[0]).read_bytes())  # a real file, out of root
    text = "file_name,label\n" + "".join(f"{f},{'ab'[i % 2]}\n" for i, f in enumerate(files))
    (tmp_path / "t.csv").write_text(text + line.format(f=files[0]) + "\n")
    table = read_table(tmp_path / "t.csv", root=tmp_path)
    lines = {b.line for b in table.bad}
    assert {b.kind for b in table.bad} == {kind} and 6 in lines
    if kind == "conflicting duplicate":  # both rows: which of the two is right is the user's call
        assert lines == {2, 6} and "also on line 2" in table.bad[1].detail


def test_an_unknown_class_outside_a_fixed_class_list_and_a_bad_split_value(tmp_path):
    files = images(tmp_path, 3)
    write_csv(tmp_path / "t.csv", [["file_name", "label", "split"], [files[0], "a", "train"],
                                   [files[1], "zebra", "val"], [files[2], "b", "holdout"]])
    table = read_table(tmp_path / "t.csv", classes=["a", "b"])
    assert [(b.line, b.kind) for b in table.bad] == [(3, "unknown class"), (4, "malformed")]
    assert "'zebra' is not in data.classes" in table.bad[0].detail and "'holdout'" in table.bad[1].detail


def test_a_repeated_row_with_the_same_labels_is_kept_once(tmp_path):
    files = images(tmp_path, 2)
    write_csv(tmp_path / "t.csv", [["file_name", "label"], [files[0], "a"], [files[1], "b"], [files[0], "a"],
                                   [f"./{files[0]}", "a"]])
    table = read_table(tmp_path / "t.csv")
    assert table.bad == [] and table.repeated == 2 and len(table.paths) == 2


def test_one_file_in_two_splits_with_the_same_label_is_a_conflicting_duplicate_naming_both_lines(tmp_path):
    """The same file in train and in test would be trained on and then scored: both rows are bad, each naming the
    other's line and split; the same file twice in one split is a repeat, kept once."""
    files = images(tmp_path, 2)
    rows = [["file_name", "label", "split"], [files[0], "cat", "train"], [files[1], "dog", "train"],
            [files[0], "cat", "test"]]
    table = read_table(write_csv(tmp_path / "t.csv", rows))
    assert [(b.line, b.kind) for b in table.bad] == [(2, "conflicting duplicate"), (4, "conflicting duplicate")]
    assert "also on line 4" in table.bad[0].detail and "also on line 2" in table.bad[1].detail
    assert "split test (line 2: train)" in table.bad[1].detail
    report = describe_bad_rows(table.path, table.bad, 3)
    assert "line 2: conflicting duplicate" in report and "line 4: conflicting duplicate" in report
    rows[3][2] = "train"  # the other side: the same split, a repeat
    table = read_table(write_csv(tmp_path / "t.csv", rows))
    assert table.bad == [] and table.repeated == 1 and table.splits == ["train", "train"]


def test_the_bad_rows_report_is_a_count_per_kind_and_at_most_eight_lines(tmp_path):
    files = images(tmp_path, 2)
    rows = [[files[0], "a"], [files[1], "b"]] + [[f"images/gone{i}.png", "a"] for i in range(20)] + [[files[0], ""]]
    table = read_table(write_csv(tmp_path / "t.csv", [["file_name", "label"], *rows]))
    report = describe_bad_rows(table.path, table.bad, 23)
    assert report.splitlines()[0].endswith("21 of 23 rows are bad (20 missing file, 1 empty label):")
    assert len(report.splitlines()) == 8 and report.splitlines()[1].startswith("  line 4: missing file:")
    assert report.splitlines()[-1] == "  ... and 15 more"


def test_the_table_of_a_root_hf_metadata_first_else_the_option_named(tmp_path):
    (tmp_path / "labels.csv").write_text("file_name,label\n")
    with pytest.raises(UserPathError, match=r"name its table with --data\.init_args\.table labels\.csv$"):
        find_table(tmp_path, None)
    (tmp_path / "metadata.jsonl").write_text("{}")
    assert find_table(tmp_path, None) == tmp_path / "metadata.jsonl"
    assert find_table(tmp_path, "labels.csv") == tmp_path / "labels.csv"
    with pytest.raises(UserPathError, match="labels table not found"):
        find_table(tmp_path, "other.csv")


def test_absolute_paths_are_taken_as_they_are_and_windows_separators_read_as_slashes(tmp_path):
    files = images(tmp_path / "data", 3)
    elsewhere = tmp_path / "data" / files[2]
    write_csv(tmp_path / "data" / "t.csv", [["file_name", "label"], [files[0].replace("/", "\\"), "a"],
                                            [f"images//{Path(files[1]).name}", "b"], [str(elsewhere), "a"]])
    table = read_table(tmp_path / "data" / "t.csv", root=tmp_path / "data" / "images")  # the third is absolute
    assert table.bad == [] and sorted(table.paths) == sorted(str(tmp_path / "data" / f) for f in files)
