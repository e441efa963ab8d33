"""The audit's report (`vit.audit.report`): text escaped for HTML, CSV of the chosen columns, and the findings
in sentences, each count on both sides of one."""

from __future__ import annotations

import base64
import csv

from vit.audit.report import data_uri, e, summary_sentences, write_csv


def test_text_is_escaped_for_elements_and_quoted_attributes_and_pngs_become_data_uris():
    assert e('<img src="x" onerror=\'alert(1)\'> & co') == (
        "&lt;img src=&quot;x&quot; onerror=&#x27;alert(1)&#x27;&gt; &amp; co")
    assert data_uri(b"\x89PNG") == "data:image/png;base64," + base64.b64encode(b"\x89PNG").decode()


def test_the_csv_holds_only_the_named_columns(tmp_path):
    path = write_csv(tmp_path / "pairs.csv", ["path_a", "kind"], [{"path_a": "a,b.png", "kind": "exact", "_a": 1}])
    assert list(csv.DictReader(path.open())) == [{"path_a": "a,b.png", "kind": "exact"}]


def summary(**changes) -> dict:
    base = {"leakage": {}, "inventory": {"bad_files": [], "small_classes": []}, "label_conflicts": 0,
            "label_issues": {}, "duplicates": {"within_split": 0}}
    return {**base, **changes}


def test_the_findings_read_as_sentences_singular_and_plural():
    assert summary_sentences(summary()) == ["nothing found"]
    said = summary_sentences(summary(
        leakage={"test": {"train": {"exact": 1, "near": 27}}}, label_conflicts=2,
        inventory={"bad_files": [{}], "small_classes": [{"class": "c", "images": 9, "largest": 100}]},
        label_issues={"trusted": True, "flagged": 1}, duplicates={"within_split": 3}))
    assert said == ["1 test image has an exact copy in train", "27 test images have a near copy in train",
                    "1 file cannot be read", "2 pairs of identical images carry different labels",
                    "1 training label looks wrong", "class 'c' has 9 training images (the largest has 100)",
                    "3 duplicate pairs lie within a split"]
    distrusted = summary_sentences(summary(label_issues={"trusted": False, "verdict": "skill 0.6", "flagged": 5}))
    assert distrusted == ["label check not trusted: skill 0.6"]  # its flags are not counted
