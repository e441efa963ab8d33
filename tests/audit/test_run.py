"""vit.audit.run: one audit of a DataModule without the command (the checks in turn, the summary, the four files,
the findings behind --fail_on), the label check on any module with an evaluated model."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import skimage.data
from PIL import Image

from tests.audit.test_duplicates import near_copy
from tests.helpers import tiny_vit
from vit.audit.run import FAIL_ON, AuditOptions, findings, run_audit

HOSTILE = "<img src=x onerror=alert(1)>.png"


def planted_folder(root: Path) -> dict[str, str]:
    """root/{train,val,test}/<photo>/: 64x64 tiles of three photos (camera: one image, a small class), plus a test
    tile copied exactly into train under another name, a near copy of another, a bad file, and a copy of the
    camera tile in astronaut/ under a hostile name (a label conflict)."""
    for name, count in (("astronaut", 14), ("coffee", 14), ("camera", 1)):
        pixels = np.asarray(Image.fromarray(getattr(skimage.data, name)()).convert("RGB"))
        for k in range(count):
            split = "test" if k % 5 == 4 else "val" if k % 5 == 3 else "train"
            y, x = divmod(k, 4)
            path = root / split / name / f"{name}{k}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels[64 * y:64 * y + 64, 64 * x + 64:64 * x + 128]).save(path)
    exact, near = root / "train/astronaut/renamed.png", root / "train/coffee/near.jpg"
    shutil.copyfile(root / "test/astronaut/astronaut4.png", exact)
    near_copy(Image.open(root / "test/coffee/coffee9.png")).save(near)
    (root / "train/coffee/empty.png").write_bytes(b"")
    shutil.copyfile(root / "train/camera/camera0.png", root / "train/astronaut" / HOSTILE)  # and a label conflict
    return {"exact": str(exact), "near": str(near)}


def planted_data(root: Path):
    """The planted folder as `vit fit`'s ImageFolder reads it (not set up: the audit does that)."""
    from vit.data import ImageFolder

    planted_folder(root)
    return ImageFolder(str(root), num_workers=0, img_size=32)


def tiny_module() -> SimpleNamespace:
    """What the label check reads of a task: its evaluated model, model config, weights' source and name."""
    model = tiny_vit(depth=1, patch_size=8, img_size=32, in_chans=3, num_classes=3)
    return SimpleNamespace(eval_model=model, model_config={"depth": 1}, hparams=SimpleNamespace(pretrained=None),
                           model_name="tiny")


# The planted folder has a class of 1 image on purpose: ImageFolder's imbalance warning is expected here.
@pytest.mark.filterwarnings("ignore:.*imbalanced classes:UserWarning")
def test_run_audit_finds_the_planted_problems_and_writes_the_four_files(tmp_path):
    data = planted_data(tmp_path / "images")
    audit = run_audit(None, data, AuditOptions(labels=False, num_workers=1))  # no label check: no module needed
    summary = audit.summary
    assert data.check_images is False  # a bad file is a finding, not a reason to stop
    assert summary["inventory"]["images_per_split"] == {"train": 23, "val": 6, "test": 4}
    assert summary["leakage"] == {"test": {"train": {"exact": 1, "near": 1}}} and summary["label_conflicts"] == 1
    assert summary["duplicates"]["exact"] == 2 and summary["duplicates"]["within_split"] == 1
    assert summary["label_issues"] is None and set(summary["scan"].values()) == {"scanned"}  # cache_dir None
    assert len(audit.pairs) == 3 and audit.issues == [] and set(audit.charts) == {"classes", "aspect"}
    assert findings(summary) == {"leakage": True, "bad_files": True, "duplicates": True, "label_conflicts": True,
                                 "small_classes": True, "label_issues": False}
    assert set(findings(summary)) == set(FAIL_ON)

    out = audit.write(tmp_path / "out" / "audit", shown=1)
    assert sorted(p.name for p in out.iterdir()) == ["duplicates.csv", "label_issues.csv", "report.html",
                                                      "summary.json"]  # no temporary file left
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary, default=str))
    with open(out / "duplicates.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 3
    page = (out / "report.html").read_text()
    assert page.count("<img ") == 2 + 2 * 1 + 2  # the charts, then 1 leaked pair and 1 conflict (shown=1)
    assert "&lt;img src=x onerror=alert(1)&gt;.png" in page


@pytest.mark.filterwarnings("ignore:.*imbalanced classes:UserWarning")
def test_the_label_check_runs_on_any_module_with_an_evaluated_model_or_says_why_it_did_not(tmp_path):
    data = planted_data(tmp_path / "images")
    options = AuditOptions(folds=3, num_workers=1, cache_dir=tmp_path / "cache", device="cpu", batch_size=8)
    labels = run_audit(tiny_module(), data, options).summary["label_issues"]
    assert labels["backbone"] == "tiny (random initialisation (no pretrained weights: expect noise))"
    # the training images less the bad file: a subset, whose features are not cached (the scans are)
    assert labels["features"] == "extracted (not cached: the dataset has no fingerprint())" and labels["folds"] == 3
    assert "camera" in labels["note"]  # a class of one training image sits the check out, and the note says so
    assert labels["flagged"] is None or labels["trusted"]  # a count only for a list the check trusts
    skipped = run_audit(None, data, options, labels_skipped="no weights").summary
    assert skipped["label_issues"] == {"flagged": None, "skipped": "no weights"}
    assert all(how.startswith("loaded from cache") for how in skipped["scan"].values())


def test_findings_never_count_a_label_list_the_report_distrusts_or_a_skipped_check():
    summary = {"inventory": {"bad_files": [], "small_classes": []}, "leakage": {}, "label_conflicts": 0,
               "duplicates": {"exact": 0, "near": 1}}
    for labels, found in ((None, False), ({"flagged": None, "skipped": "why"}, False),
                          ({"flagged": 4, "trusted": False}, False), ({"flagged": 0, "trusted": True}, False),
                          ({"flagged": 4, "trusted": True}, True)):
        result = findings({**summary, "label_issues": labels})
        assert result["label_issues"] is found and result["duplicates"] is True and not result["leakage"]


def test_an_audit_of_a_multi_label_table_checks_files_duplicates_and_leakage_and_says_the_label_check_does_not_apply(
        tmp_path):
    from vit.data import LabelsFile

    root = tmp_path / "tagged"
    planted = planted_folder(root)  # the same tiles, now listed in a table with tags and their split folders
    rows = [["file_name", "tags", "split"]]
    for path in sorted(root.rglob("*.*")):
        split, kind = path.relative_to(root).parts[:2]
        tags = {"astronaut": "person;outdoor", "coffee": "cup", "camera": "person;indoor"}[kind]
        rows.append([str(path.relative_to(root)), tags, split])
    rows.append(["train/coffee/gone.png", "cup", "train"])  # a missing file
    rows[[r[0] for r in rows].index(str(Path(planted["exact"]).relative_to(root)))][1] = "cup"  # another label set
    with (root / "metadata.csv").open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    data = LabelsFile(str(root), num_workers=0, img_size=32)
    summary = run_audit(None, data, AuditOptions(num_workers=1)).summary
    assert summary["multi_label"] and summary["inventory"]["classes"] == ["cup", "indoor", "outdoor", "person"]
    per_class = summary["inventory"]["images_per_class"]["train"]  # images that have each tag, counted by hand:
    # cup: coffee's 9 + near + empty + the relabelled copy; indoor: camera's 1 (its copy sits in astronaut/);
    # outdoor: astronaut's 9 + the camera copy; person: those 10 + camera's 1
    assert per_class == [9 + 3, 1, 9 + 1, 10 + 1]
    assert summary["leakage"] == {"test": {"train": {"exact": 1, "near": 1}}}
    assert summary["label_conflicts"] == 2  # the copy relabelled "cup"; the camera tile among astronaut's tags
    assert summary["label_issues"]["skipped"].startswith("not run: confident learning assumes one label per image")
    assert summary["bad_rows"] == [{"line": len(rows), "kind": "missing file", "detail": str(root /
                                                                                           "train/coffee/gone.png")}]
    assert any(b["problem"] == f"missing (line {len(rows)} of the table)" for b in summary["inventory"]["bad_files"])
    assert findings(summary)["bad_files"] and not findings(summary)["label_issues"]
