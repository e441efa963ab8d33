"""`vit select` end to end on a tiny folder: a labels file `vit fit` reads once filled, a grid, duplicates left
out; and its three mistakes (a budget over the pool, an empty pool, labels outside the pool) in one line each."""

from __future__ import annotations

import csv
import shutil

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from vit.commands import main
from vit.commands.select import parse_args
from vit.data.rows import read_table

MODEL = ["--model", "vit_digits_patch4_16"]  # random weights: the plumbing, not the choice, is tested here


def digit_folder(folder, n=12):
    """``n`` sklearn digits as 16x16 PNGs, and an exact copy of the first two (named to sort after them)."""
    folder.mkdir(parents=True, exist_ok=True)
    images = load_digits().images[:n]
    files = []
    for i, image in enumerate(images):
        pixels = np.kron((image * 255 / 16).astype(np.uint8), np.ones((2, 2), np.uint8))
        Image.fromarray(pixels).save(path := folder / f"d{i:02d}.png")
        files.append(path)
    for i in range(min(2, n)):
        shutil.copy(files[i], folder / f"d{i:02d}_copy.png")
    return files


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_select_writes_a_labels_file_to_fill_and_a_grid_and_leaves_copies_out(tmp_path, capsys):
    digit_folder(pool := tmp_path / "pool")
    out = tmp_path / "to_label.csv"
    result = main(["select", "--from", str(pool), "--budget", "12", "--out", str(out), *MODEL])
    assert result is None  # the console script returns nothing
    assert "chose 12 of 14 images, 2 near-duplicates left out" in capsys.readouterr().out
    chosen = rows(out)
    assert list(chosen[0]) == ["file_name", "label", "reason"]
    names = [r["file_name"] for r in chosen]
    assert sorted(names) == [f"pool/d{i:02d}.png" for i in range(12)]  # every original, no copy
    assert all(r["label"] == "" and r["reason"].startswith("typical") for r in chosen)
    with Image.open(out.with_suffix(".png")) as grid:
        assert grid.size == (10 * 96, 2 * 96)
    for r, label in zip(chosen, "0123456789" * 2):  # filled in: the labels-file format, with no bad row
        r["label"] = label
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, ["file_name", "label", "reason"])
        writer.writeheader()
        writer.writerows(chosen)
    table = read_table(out)
    assert not table.bad and len(table.paths) == 12 and table.class_names == list("0123456789")


def test_a_later_round_leaves_the_labelled_images_out(tmp_path):
    digit_folder(pool := tmp_path / "pool")
    labelled = tmp_path / "labels.csv"
    labelled.write_text("file_name,label\n" + "".join(f"pool/d{i:02d}.png,{i % 10}\n" for i in range(10)))
    out = tmp_path / "round2.csv"
    main(["select", "--from", str(pool), "--budget", "2", "--out", str(out), "--labelled", str(labelled), *MODEL])
    assert sorted(r["file_name"] for r in rows(out)) == ["pool/d10.png", "pool/d11.png"]


def error_of(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


def test_a_budget_over_the_pool_is_one_line(tmp_path, capsys):
    digit_folder(pool := tmp_path / "pool", n=3)  # 5 images
    ok = main(["select", "--from", str(pool), "--budget", "5", "--out", str(tmp_path / "a.csv"),
               "--no_duplicates_check", *MODEL])
    assert ok is None and len(rows(tmp_path / "a.csv")) == 5  # the boundary: all of them
    err = error_of(["select", "--from", str(pool), "--budget", "6", "--out", str(tmp_path / "b.csv"), *MODEL], capsys)
    assert err == f"vit select: error: --budget 6 is more than the 5 unlabelled images in {pool}"


def test_a_pool_without_images_is_one_line(tmp_path, capsys):
    (pool := tmp_path / "empty").mkdir()
    (pool / "notes.txt").write_text("no images here")
    err = error_of(["select", "--from", str(pool), "--budget", "1", "--out", str(tmp_path / "a.csv"), *MODEL], capsys)
    assert err.startswith(f"vit select: error: --from {pool}: the pool holds no images")


def test_labels_naming_images_outside_the_pool_are_one_line(tmp_path, capsys):
    digit_folder(pool := tmp_path / "pool", n=3)
    digit_folder(other := tmp_path / "other", n=1)
    labelled = tmp_path / "labels.csv"
    labelled.write_text("file_name,label\npool/d00.png,0\nother/d00.png,0\n")
    err = error_of(["select", "--from", str(pool), "--budget", "1", "--out", str(tmp_path / "a.csv"),
                    "--labelled", str(labelled), *MODEL], capsys)
    assert err == (f"vit select: error: --labelled {labelled} names 1 image(s) outside the pool (e.g. "
                   f"{other / 'd00.png'}); give the labels file of this pool's images")


def test_features_come_from_a_checkpoint_or_a_named_model_not_both_nor_neither(capsys):
    for features in ([], ["--ckpt", "a.ckpt", "--model", "vit_digits_patch4_16"]):
        with pytest.raises(SystemExit):
            parse_args(["--from", "pool", "--budget", "1", "--out", "a.csv", *features])
        assert "give either --ckpt CKPT or --model NAME" in capsys.readouterr().err
    assert parse_args(["--from", "pool", "--budget", "1", "--out", "a.csv", *MODEL]).budget == 1
