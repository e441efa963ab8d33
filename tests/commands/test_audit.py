"""`vit audit` end to end: a folder of real photo tiles with planted leakage, a bad file, a hostile file name and
a small class; its CSV, JSON and HTML outputs; --fail_on; and an in-memory dataset (the digits)."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import skimage.data
from PIL import Image

from tests import CONFIGS
from tests.audit.test_run import HOSTILE, planted_folder
from tests.helpers import TINY_DIM
from vit.commands import main, run


def audit_args(root: Path, out: Path, tmp_path: Path, *extra: str) -> list[str]:
    """`vit audit` on ``root`` with a one-block ViT of width 32 (random init), without a config file."""
    return ["audit", "--model", "vit.tasks.ImageClassifier", "--model.init_args.model", "vit_tiny_patch16_224",
            "--model.init_args.model_kwargs", f"{{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2, patch_size: 8}}",
            "--data", "vit.data.ImageFolder", "--data.root", str(root), "--data.img_size", "32",
            "--data.num_workers", "0", "--cache_dir", str(tmp_path / "cache"), "--out", str(out),
            "--num_workers", "2", "--folds", "3", "--seed_everything", "0", *extra]


# The planted folder has a class of 1 image on purpose: ImageFolder's imbalance warning is expected here.
@pytest.mark.filterwarnings("ignore:.*imbalanced classes:UserWarning")
def test_audit_finds_leakage_bad_files_and_small_classes_and_writes_a_safe_report(tmp_path, capsys):
    root, out = tmp_path / "images", tmp_path / "audit"
    planted = planted_folder(root)
    summary = run(audit_args(root, out, tmp_path))
    printed = capsys.readouterr().out
    assert "1 test image has an exact copy in train" in printed and "1 test image has a near copy in train" in printed
    assert "1 file cannot be read" in printed and "class 'camera' has 1 training images" in printed
    assert "1 pair of identical images carries different labels" in printed

    written = json.loads((out / "summary.json").read_text())
    inv = written["inventory"]
    assert inv["images"] == 33 and inv["images_per_split"] == {"train": 23, "val": 6, "test": 4}
    assert inv["images_per_class"]["train"] == [11, 1, 11]  # astronaut, camera, coffee (sorted folders)
    assert inv["small_classes"] == [{"class": "camera", "images": 1, "largest": 11}]  # under 10% of 11
    assert inv["bad_files"] == [{"path": str(root / "train/coffee/empty.png"), "split": "train",
                                 "problem": "empty file (0 bytes)"}]
    assert inv["modes"] == {"RGB": 32} and inv["formats"] == {"PNG": 31, "JPEG": 1}
    assert written["leakage"] == {"test": {"train": {"exact": 1, "near": 1}}} and written["label_conflicts"] == 1
    assert written["duplicates"]["cross_split_exact"] == 1 and written["duplicates"]["cross_split_near"] == 1
    labels = written["label_issues"]
    assert labels["backbone"].startswith("vit_tiny_patch16_224 (random initialisation")
    # Random features still tell astronaut tiles from coffee ones (colour): the verdict says how well, beside chance.
    assert labels["chance_balanced_accuracy"] == 0.5 and "out-of-fold accuracy" in labels["verdict"]
    for key in ("accuracy", "balanced_accuracy", "chance_accuracy", "chance_balanced_accuracy"):
        assert 0 <= labels[key] <= 1

    with open(out / "duplicates.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["path_a", "split_a", "path_b", "split_b", "kind", "distance", "score", "needed"]
    cross = [r for r in rows if r["split_a"] != r["split_b"]]
    assert rows[:len(cross)] == cross  # cross-split pairs first
    found = {(r["path_a"], r["path_b"], r["kind"]) for r in cross}
    assert (planted["exact"], str(root / "test/astronaut/astronaut4.png"), "exact") in found
    assert (planted["near"], str(root / "test/coffee/coffee9.png"), "near") in found
    assert len(cross) == 2
    hostile = str(root / "train/astronaut" / HOSTILE)
    assert {(r["path_a"], r["path_b"], r["kind"], r["distance"]) for r in rows if r["split_a"] == r["split_b"]} == {
        (hostile, str(root / "train/camera/camera0.png"), "exact", "0")}
    near = next(r for r in cross if r["kind"] == "near")
    assert 0 < int(near["distance"]) <= 10 and 0.85 <= float(near["needed"]) <= float(near["score"]) < 1
    with open(out / "label_issues.csv", newline="") as f:
        issues = list(csv.DictReader(f))
    assert len(issues) == (labels["flagged"] if labels["trusted"] else 0)  # an untrusted list names no image

    page = (out / "report.html").read_text()
    for section in ("summary", "inventory", "bad-files", "duplicates", "label-issues"):
        assert f'<section id="{section}">' in page
    sources = re.findall(r'<img [^>]*src="([^"]*)"', page)
    # 2 charts, 2 leaked pairs and the label conflict side by side, a thumbnail per label issue: all embedded
    assert len(sources) == 2 + 2 * 3 + min(len(issues), 60) == page.count("<img ")
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r"https?://|<script|onerror=alert\(1\)>|<img src=x", page)
    assert "&lt;img src=x onerror=alert(1)&gt;.png" in page  # the hostile name, as text
    assert "empty file (0 bytes)" in page and "random initialisation" in page
    assert summary["out"] == str(out)


# The planted folder has a class of 1 image on purpose: ImageFolder's imbalance warning is expected here.
@pytest.mark.filterwarnings("ignore:.*imbalanced classes:UserWarning")
def test_fail_on_sets_the_exit_status(tmp_path, capsys):
    root = tmp_path / "images"
    planted_folder(root)
    base = audit_args(root, tmp_path / "a", tmp_path, "--no_labels")
    run([*base, "--fail_on", "label_issues"])  # not looked for (--no_labels), so not found: status 0

    with pytest.raises(SystemExit) as done:
        main([*base, "--fail_on", "leakage,bad_files"])
    assert done.value.code == 1
    assert "found leakage, bad_files (--fail_on): exit status 1" in capsys.readouterr().out
    assert (tmp_path / "a" / "report.html").is_file()  # written before failing
    with pytest.raises(SystemExit) as done:
        main([*base, "--fail_on", "leakage,typo"])
    assert done.value.code == 2 and "--fail_on: unknown typo" in capsys.readouterr().err


# The planted folder has a class of 1 image on purpose: ImageFolder's imbalance warning is expected here.
@pytest.mark.filterwarnings("ignore:.*imbalanced classes:UserWarning")
def test_audit_without_weights_runs_the_other_checks_and_says_why_labels_were_skipped(tmp_path, capsys):
    root = tmp_path / "images"
    planted_folder(root)
    missing = tmp_path / "no_such_weights.safetensors"
    summary = run([*audit_args(root, tmp_path / "a", tmp_path), "--model.init_args.pretrained", str(missing)])
    printed = capsys.readouterr().out
    assert summary["leakage"] == {"test": {"train": {"exact": 1, "near": 1}}}  # the other checks ran
    assert summary["inventory"]["bad_files"] and summary["label_issues"]["flagged"] is None
    assert "label check skipped: the pretrained weights could not be loaded" in printed
    assert str(missing) in summary["label_issues"]["skipped"]


def test_audit_of_the_digits_names_images_by_their_place(tmp_path, capsys):
    out = tmp_path / "audit"
    summary = run(["audit", "--config", str(CONFIGS / "digits.yaml"), "--out", str(out),
                   "--cache_dir", str(tmp_path / "cache"), "--radius", "0"])
    assert summary["inventory"]["images_per_split"] == {"train": 1259, "val": 179, "test": 359}
    assert summary["inventory"]["modes"] == {"L": 1797} and summary["inventory"]["sizes"][0]["width"] == 16
    assert summary["label_issues"]["features"].startswith("extracted, cached")
    labels = summary["label_issues"]
    assert labels["accuracy"] > labels["chance_accuracy"] and labels["chance_balanced_accuracy"] == 0.1
    with open(out / "duplicates.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(re.fullmatch(r"digits\[\d+\]", r["path_a"]) for r in rows)
    assert all(how.startswith("scanned, cached") for how in summary["scan"].values())
    again = run(["audit", "--config", str(CONFIGS / "digits.yaml"), "--out", str(tmp_path / "again"), "--cache_dir",
                 str(tmp_path / "cache"), "--radius", "0"])
    assert again["label_issues"]["features"].startswith("loaded from cache")
    assert list(again["scan"]) == ["train", "val", "test"]
    assert all(how.startswith("loaded from cache") for how in again["scan"].values())
    assert "the scan of train, val, test came from the cache" in capsys.readouterr().out
    # The cached scan finds what the scan found: every figure and every pair.
    same = lambda s: {k: v for k, v in s.items() if k not in ("scan", "seconds", "out", "label_issues")}
    assert same(again) == same(summary) and again["label_issues"]["flagged"] == summary["label_issues"]["flagged"]
    assert (tmp_path / "again" / "duplicates.csv").read_bytes() == (out / "duplicates.csv").read_bytes()


@pytest.mark.filterwarnings("ignore:.*imbalanced classes:UserWarning")
def test_a_second_audit_rescans_the_split_whose_files_changed_and_no_other(tmp_path, capsys):
    """The scan cache is keyed by every file's path, size and modification time: a test tile overwritten with a
    copy of a training tile is found as leakage on the next audit, which reads the test split again and takes
    train and val from the cache."""
    root = tmp_path / "images"
    planted_folder(root)
    first = run(audit_args(root, tmp_path / "a", tmp_path, "--no_labels"))
    assert first["leakage"] == {"test": {"train": {"exact": 1, "near": 1}}}
    shutil.copyfile(root / "train/coffee/coffee0.png", root / "test/coffee/coffee14.png")  # a new file in test
    second = run(audit_args(root, tmp_path / "b", tmp_path, "--no_labels"))
    assert second["scan"]["train"].startswith("loaded from cache") and second["scan"]["val"].startswith("loaded")
    assert second["scan"]["test"].startswith("scanned, cached")
    assert second["leakage"] == {"test": {"train": {"exact": 2, "near": 1}}}
    (root / "test/coffee/coffee14.png").write_bytes(b"")  # the same path, now empty: size and time changed
    third = run(audit_args(root, tmp_path / "c", tmp_path, "--no_labels"))
    assert third["scan"]["test"].startswith("scanned, cached") and third["leakage"] == first["leakage"]
    assert str(root / "test/coffee/coffee14.png") in {bad["path"] for bad in third["inventory"]["bad_files"]}
    uncached = run(audit_args(root, tmp_path / "d", tmp_path, "--no_labels", "--no_cache"))
    assert set(uncached["scan"].values()) == {"scanned"} and uncached["leakage"] == third["leakage"]
    (tmp_path / "not_a_folder").touch()  # a --cache_dir that cannot be one: the audit runs and says so
    args = audit_args(root, tmp_path / "e", tmp_path, "--no_labels")
    args[args.index("--cache_dir") + 1] = str(tmp_path / "not_a_folder")
    capsys.readouterr()
    unsaved = run(args)
    assert all(how.startswith("scanned, not cached (FileExistsError") for how in unsaved["scan"].values())
    assert unsaved["leakage"] == third["leakage"]
    assert capsys.readouterr().out.count("the scan was not cached: FileExistsError") == 1


def test_fail_on_label_issues_never_fails_on_a_list_the_report_distrusts(tmp_path, capsys):
    """Tiles of one photo under two random labels: no feature separates them, so the classifier sits at chance,
    the summary says so first, no image is called wrongly labelled, and --fail_on label_issues passes."""
    root = tmp_path / "images"
    pixels = np.asarray(skimage.data.astronaut())
    rng = np.random.default_rng(0)
    for k in range(48):
        y, x = divmod(k, 8)
        split = "val" if k % 8 == 6 else "test" if k % 8 == 7 else "train"
        path = root / split / str("ab"[int(rng.integers(2))]) / f"tile{k}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[64 * y:64 * y + 64, 64 * x:64 * x + 64]).save(path)
    summary = run([*audit_args(root, tmp_path / "a", tmp_path), "--fail_on", "label_issues"])  # no SystemExit
    labels = summary["label_issues"]
    assert labels["trusted"] is False and labels["flagged"] is None and labels["skill"] < 0.5
    printed = capsys.readouterr().out
    first = next(line for line in printed.splitlines() if line.startswith("  "))
    assert first.startswith("  label check not trusted: out-of-fold accuracy") and "too close to chance" in first
    assert "labels look wrong" not in printed and "label looks wrong" not in printed
    assert (tmp_path / "a" / "label_issues.csv").read_text().strip() == "path,split,given,suggested,score"


def test_audit_arguments_need_data_and_two_folds_at_least():
    from vit.commands.audit import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--folds", "2"])  # no config, model or data
    args, rest = parse_args(["--config", "c.yaml", "--folds", "2"])
    assert args.folds == 2 and rest == ["--config", "c.yaml"]
    with pytest.raises(SystemExit):
        parse_args(["--config", "c.yaml", "--folds", "1"])
