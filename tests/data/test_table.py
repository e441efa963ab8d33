"""LabelsFile (vit.data.table): a labels table as a DataModule. The same run as the class folders it lists, bit for
bit; multi-label items with unknowns; splits; bad rows reported at setup in a few lines; the table found where users
put it."""

from __future__ import annotations

import csv
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import seed_everything

from tests.formats import write_class_folders
from tests.helpers import TINY_DIM, quick_trainer, random_images, tiny_classifier
from vit.data import ImageFolder
from vit.data.table import LabelsFile
from vit.errors import UserError, UserValueError

OPTS = dict(img_size=8, batch_size=8, num_workers=0)


def write_csv(path: Path, rows: list[list[object]]) -> Path:
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def flat(root: Path, labels: list[str], table: str = "labels.csv", column: str = "label") -> list[str]:
    """root/images/<i>.png, one per label, listed in root/``table``; returns the table's paths."""
    files = [f"images/{p.name}" for p in random_images(root / "images", len(labels), mode="RGB")]
    write_csv(root / table, [["file_name", column], *zip(files, labels)])
    return files


def fit_and_test(data, root: Path) -> tuple[dict, list[dict]]:
    seed_everything(0)
    model = tiny_classifier(num_classes=3, in_chans=3, img_size=8)
    trainer = quick_trainer(root, max_epochs=2, deterministic=True)
    trainer.fit(model, datamodule=data)
    return model.state_dict(), trainer.test(model, datamodule=data, verbose=False)


def test_a_csv_listing_class_folders_in_any_order_gives_the_same_run_bit_for_bit(tmp_path):
    files = write_class_folders(tmp_path / "tree", ["cat", "dog", "owl"], per_class=12, size=12)
    rows = [[str(f.relative_to(tmp_path / "tree")), f.parent.name] for f in files]
    random.Random(0).shuffle(rows)
    write_csv(tmp_path / "tree" / "labels.csv", [["path", "label"], *rows])
    folder, table = ImageFolder(str(tmp_path / "tree"), **OPTS), LabelsFile(str(tmp_path / "tree/labels.csv"), **OPTS)
    assert table.class_names == folder.class_names == ["cat", "dog", "owl"]
    weights_folder, test_folder = fit_and_test(folder, tmp_path / "a")
    weights_table, test_table = fit_and_test(table, tmp_path / "b")
    for split in ("train", "val", "test"):  # the same images, in the same order
        assert getattr(table, f"{split}_set").samples == getattr(folder, f"{split}_set").samples
    assert weights_folder.keys() == weights_table.keys()
    assert all(torch.equal(weights_folder[k], weights_table[k]) for k in weights_folder)
    assert test_folder == test_table and "test_acc" in test_folder[0]
    seed_everything(1)  # the check can tell runs apart: another seed moves the weights
    other = tiny_classifier(num_classes=3, in_chans=3, img_size=8)
    quick_trainer(tmp_path / "c", max_epochs=2).fit(other, datamodule=LabelsFile(str(tmp_path / "tree/labels.csv"),
                                                                                 **{**OPTS, "seed": 1}))
    assert not all(torch.equal(weights_folder[k], v) for k, v in other.state_dict().items())


def test_a_flat_folder_beside_labels_csv_is_named_by_imagefolder_in_one_line_and_read_by_labelsfile(tmp_path):
    flat(tmp_path, ["cat", "dog"] * 5)
    with pytest.raises(UserValueError) as error:
        _ = ImageFolder(str(tmp_path), **OPTS).class_names
    assert str(error.value).count("\n") == 0
    assert str(error.value).endswith(f"--data vit.data.LabelsFile --data.init_args.root {tmp_path} "
                                     "--data.init_args.table labels.csv")
    with pytest.raises(UserError, match=r"name its table with --data\.init_args\.table labels\.csv"):
        _ = LabelsFile(str(tmp_path), **OPTS).class_names
    data = LabelsFile(str(tmp_path), table="labels.csv", **OPTS)
    data.setup("fit")
    assert data.class_names == ["cat", "dog"] and not data.multi_label
    image, label = data.train_set[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 8, 8) and isinstance(label, int)


def test_hf_metadata_csv_is_found_without_options_and_imagefolder_points_to_it(tmp_path):
    flat(tmp_path, ["cat", "dog"] * 5, table="metadata.csv")
    with pytest.raises(UserValueError, match=r"metadata.csv, and no class folders: .*root \S+$"):
        _ = ImageFolder(str(tmp_path), **OPTS).class_names
    data = LabelsFile(str(tmp_path), **OPTS)
    data.setup("fit")
    # per class of 5: val and test take one each (at least one from a class of two or more)
    assert (len(data.train_set), len(data.val_set), len(data.test_set)) == (6, 2, 2)


def multi(root: Path) -> LabelsFile:
    rows = [["file_name", "a", "b", "c"]]
    for i, f in enumerate(p.name for p in random_images(root, 30, mode="RGB")):
        rows.append([f, "1" if i % 2 else "0", "" if i % 5 == 0 else str(i % 3 % 2), "-1" if i == 7 else "1"])
    write_csv(root / "metadata.csv", rows)
    return LabelsFile(str(root), **OPTS)


def test_multi_label_items_are_float_targets_with_unknowns_as_minus_one(tmp_path):
    data = multi(tmp_path)
    assert data.multi_label and data.class_names == ["a", "b", "c"]
    data.setup("fit")
    for split in (data.train_set, data.val_set, data.test_set):
        for k, (path, _) in enumerate(split.samples):
            i = int(Path(path).stem)  # the table's row: its targets as written above
            target = split[k][1]
            assert target.dtype == torch.float32
            assert target.tolist() == [i % 2, -1 if i % 5 == 0 else i % 3 % 2, -1 if i == 7 else 1]
    _, targets = next(iter(data.val_dataloader()))
    assert targets.shape == (len(data.val_set), 3) and targets.dtype == torch.float32
    train_targets = data.train_set.labels
    assert data.class_counts("train") == (train_targets > 0).sum(0).tolist()
    with pytest.raises(UserValueError, match="balanced_sampling"):
        LabelsFile(str(tmp_path), balanced_sampling=True, **OPTS).train_sampler()


def test_an_undecodable_multi_label_image_is_replaced_by_another_with_its_own_labels(tmp_path):
    data = multi(tmp_path)
    data.skip_bad_images = True
    data.setup("fit")
    targets = data.train_set.labels
    k = next(k for k in range(len(targets) - 1) if not torch.equal(targets[k], targets[k + 1]))
    (path, row), (_, other_row) = data.train_set.samples[k:k + 2]  # the next image stands in for it
    Path(path).write_bytes(Path(path).read_bytes()[:60])  # the header survives, the pixels do not
    _, target = data.eval_split("train")[k]
    assert target.tolist() == data.train_set.targets[other_row].tolist() != data.train_set.targets[row].tolist()


def test_a_split_column_gives_the_splits_and_without_val_rows_val_is_held_out_of_train(tmp_path):
    files = [p.name for p in random_images(tmp_path, 20, mode="RGB")]
    splits = ["train"] * 14 + ["validation"] * 3 + ["test"] * 3
    write_csv(tmp_path / "metadata.csv", [["file_name", "label", "split"],
                                          *[[f, "ab"[i % 2], s] for i, (f, s) in enumerate(zip(files, splits))]])
    data = LabelsFile(str(tmp_path), **OPTS)
    data.setup("fit")
    names = lambda d: sorted(Path(p).name for p, _ in d.samples)
    assert names(data.val_set) == sorted(files[14:17]) and names(data.test_set) == sorted(files[17:])
    write_csv(tmp_path / "metadata.csv", [["file_name", "label", "split"],
                                          *[[f, "ab"[i % 2], "train"] for i, f in enumerate(files)]])
    data = LabelsFile(str(tmp_path), val_fraction=0.2, **OPTS)
    data.setup("fit")
    assert len(data.val_set) == 4 and data.test_set is data.val_set
    assert sorted(label for _, label in data.val_set.samples) == [0, 0, 1, 1]


def test_a_multi_label_table_without_val_rows_holds_val_out_of_its_train_rows_alone(tmp_path):
    """Every third row test, none val: val is drawn from the train rows, and no test image reaches train or val
    (the split's positions among the train rows are not the table's rows)."""
    files = [p.name for p in random_images(tmp_path, 30, mode="RGB")]
    splits = ["test" if i % 3 == 0 else "train" for i in range(30)]
    write_csv(tmp_path / "metadata.csv", [["file_name", "a", "b", "split"],
                                          *[[f, i % 2, i // 2 % 2, s] for i, (f, s) in enumerate(zip(files, splits))]])
    data = LabelsFile(str(tmp_path), val_fraction=0.25, **OPTS)
    assert data.multi_label
    data.setup("fit")
    names = lambda d: {Path(p).name for p, _ in d.samples}
    test = {f for f, s in zip(files, splits) if s == "test"}
    assert names(data.test_set) == test
    assert not names(data.train_set) & test and not names(data.val_set) & test
    assert names(data.train_set) | names(data.val_set) == set(files) - test and data.val_set.samples
    for split in (data.train_set, data.val_set):  # each image keeps its own row's labels
        for k, (path, _) in enumerate(split.samples):
            i = files.index(Path(path).name)
            assert split[k][1].tolist() == [i % 2, i // 2 % 2]


BAD_ROWS = {  # a bad row appended as line 13, after 10 good rows (lines 2-11) and a repeat of line 4
    "missing file": "images/gone.png,cat",
    "unknown class": "images/0.png,zebra",
    "empty label": "images/0.png,",
    "conflicting duplicate": "images/0.png,dog",
    "outside root": "../elsewhere.png,cat",
    "malformed": "images/1.png,cat,extra",
}


@pytest.mark.parametrize("kind", list(BAD_ROWS))
def test_each_bad_row_is_an_error_at_setup_naming_its_line_in_at_most_ten_lines(tmp_path, kind, caplog):
    root = tmp_path / "root"
    flat(root, ["cat", "dog"] * 5)
    (tmp_path / "elsewhere.png").write_bytes((root / "images/0.png").read_bytes())
    with (root / "labels.csv").open("a") as f:
        f.write("images/2.png,cat\n" + BAD_ROWS[kind] + "\n")  # line 12 repeats line 4 exactly: kept once
    options = dict(table="labels.csv", classes=["cat", "dog"], **OPTS)
    with pytest.raises(UserValueError) as error:
        LabelsFile(str(root), **options).setup("fit")
    message = str(error.value)
    assert len(message.splitlines()) <= 10 and "Traceback" not in message
    assert f"line 13: {kind}:" in message and f"of 12 rows are bad ({'2' if kind == 'conflicting duplicate' else 1} "\
        f"{kind})" in message and message.endswith("set data.skip_bad_rows: true to train without them.")
    skipped = LabelsFile(str(root), skip_bad_rows=True, **options)
    with caplog.at_level(logging.WARNING):
        skipped.setup("fit")
    assert f"line 13: {kind}" in caplog.text
    kept = sum(len(s.samples) for s in (skipped.train_set, skipped.val_set, skipped.test_set))
    assert kept == (9 if kind == "conflicting duplicate" else 10)
    files_only = LabelsFile(str(root), skip_bad_images=True, **options)  # skip_bad_images covers files alone
    if kind == "missing file":
        files_only.setup("fit")
    else:
        with pytest.raises(UserValueError, match=f"line 13: {kind}"):
            files_only.setup("fit")


def test_no_usable_rows_and_a_class_without_a_training_image_are_errors_that_say_so(tmp_path):
    write_csv(tmp_path / "metadata.csv", [["file_name", "label"], ["gone.png", "a"]])
    with pytest.raises(UserValueError, match="no usable rows"):
        _ = LabelsFile(str(tmp_path), skip_bad_rows=True, **OPTS).class_names
    files = [p.name for p in random_images(tmp_path, 6, mode="RGB")]
    write_csv(tmp_path / "metadata.csv", [["file_name", "label", "split"], *[[f, "a", "train"] for f in files[:4]],
                                          [files[4], "b", "val"], [files[5], "a", "val"]])
    with pytest.raises(UserValueError, match="no training image of class 'b'"):
        LabelsFile(str(tmp_path), **OPTS).setup("fit")
    rows = [[files[0], "a;b"], [files[1], "a"], [files[2], "a;c"], *[[f, "a"] for f in files[3:]]]
    write_csv(tmp_path / "metadata.csv", [["file_name", "tags"], *rows])
    data = LabelsFile(str(tmp_path), **OPTS)  # b and c have one image each: the split keeps it for training
    data.setup("fit")
    assert min(data.class_counts("train")) == 1 and np.all(data.train_set.labels.sum(0).numpy() >= 1)


def split_on_a_rank(rank: int, world: int, port: int, root: str, out: str) -> None:
    """One DDP rank (gloo on localhost): a multi-label LabelsFile set up; writes its splits to out/rank<rank>.json."""
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        data = LabelsFile(root, **OPTS)
        data.setup("fit")
        splits = {name: getattr(data, f"{name}_set").samples for name in ("train", "val", "test")}
        targets = data.train_set.labels.tolist()
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"splits": splits, "targets": targets}))


@pytest.mark.slow
def test_under_ddp_every_rank_reads_the_same_rows_into_the_same_splits(tmp_path):
    import json

    import torch.multiprocessing as mp

    from tests.conftest import free_port

    multi(tmp_path / "data")
    alone = LabelsFile(str(tmp_path / "data"), **OPTS)
    alone.setup("fit")
    mp.start_processes(split_on_a_rank, args=(2, free_port(), str(tmp_path / "data"), str(tmp_path)), nprocs=2,
                       start_method="fork")  # forked: no re-import of torch per rank
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for seen in ranks:
        assert {name: [tuple(s) for s in samples] for name, samples in seen["splits"].items()} == {
            name: getattr(alone, f"{name}_set").samples for name in ("train", "val", "test")}
        assert seen["targets"] == alone.train_set.labels.tolist()


def test_vit_fit_on_a_table_of_bad_rows_or_imagefolder_on_a_flat_folder_is_a_short_message(tmp_path, monkeypatch,
                                                                                             capsys):
    from tests.test_errors import SCRATCH, user_error

    monkeypatch.chdir(tmp_path)
    flat(tmp_path / "flat", ["cat", "dog"] * 5)
    with (tmp_path / "flat/labels.csv").open("a") as f:  # more bad rows than the report lists one by one
        f.write("".join(f"images/gone{i}.png,cat\n" for i in range(12)) + "images/0.png,\n")
    err = user_error(["fit", "--config", SCRATCH, "--data", "vit.data.LabelsFile", "--data.init_args.root",
                      "flat/labels.csv"], capsys)  # (user_error: exit 1, at most 10 lines, no traceback)
    assert "13 of 23 rows are bad (12 missing file, 1 empty label):" in err and "  ... and 7 more" in err
    err = user_error(["fit", "--config", SCRATCH, "--data.init_args.root", "flat"], capsys)
    assert "flat holds a labels table, labels.csv, and no class folders: read it with --data vit.data.LabelsFile" in err


def fit_argv(root: Path, table: str, *extra: str) -> list[str]:
    """`vit fit` of scratch_small on the labels ``table``, a tiny model for one short epoch, outputs under ``root``."""
    from tests.conftest import quiet_run
    from tests.test_errors import SCRATCH

    return ["fit", *quiet_run(root / "run", SCRATCH), "--data", "vit.data.LabelsFile", "--data.init_args.root", table,
            "--data.init_args.num_workers=0",
            "--data.init_args.val_fraction=0.25", "--data.init_args.test_fraction=0", "--trainer.max_epochs=1",
            f"--model.init_args.model_kwargs={{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2}}",
            "--test_after_fit=false",
            *extra]


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
@pytest.mark.parametrize("multi", [False, True])
def test_the_imbalance_warnings_advice_runs_as_printed_and_weighs_rare_classes_up(tmp_path, monkeypatch, multi):
    """The warning said model.class_weighting (moved: exit 2) and data.balanced_sampling (refused for multi-label:
    exit 1). Each flag it prints now runs as printed, and turns the weighting on."""
    import shlex

    from vit.cli.main import cli

    monkeypatch.chdir(tmp_path)
    if multi:  # "a" on every image, "b" on 5 of 80 (6%: multi-label data, inferred): positives 80 and 5
        flat(tmp_path / "data", ["a;b" if i % 16 == 0 else "a" for i in range(80)])
    else:
        flat(tmp_path / "data", ["many"] * 44 + ["few"] * 4)
    argv = fit_argv(tmp_path, "data/labels.csv")
    with pytest.warns(UserWarning, match="imbalanced classes") as warned:
        cli(argv)
    (message,) = [str(w.message) for w in warned if "imbalanced classes" in str(w.message)]
    advice = message.split("; consider ", 1)[1].split(", or ")
    assert len(advice) == (1 if multi else 2) and all(a.startswith("--") for a in advice), message
    for i, flags in enumerate(advice):
        run = cli([*argv, *shlex.split(flags), f"--checkpoint.dirpath={tmp_path}/advice{i}"])
        if "balanced_sampling" in flags:
            assert run.datamodule.train_sampler() is not None
        else:
            assert run.model.head.class_weighting and run.model.head.label_kind == ("multi" if multi else "single")


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_vit_fit_on_one_stray_list_cell_stops_before_training_and_multi_label_true_trains_by_val_map(
        tmp_path, monkeypatch, capsys):
    """``"zero, six"`` among single labels trained, then died after the first validation in a 73-line traceback
    (ModelCheckpoint(monitor='val_acc') found no such key). Now: the rows and the choice, before training; and a
    run told data.multi_label true keeps its best checkpoint by val_map on scratch_small's default monitor."""
    from tests.test_errors import user_error
    from vit.cli.main import cli

    monkeypatch.chdir(tmp_path)
    labels = ["zero", "six"] * 24
    labels[5] = "zero, six"  # (csv quotes it)
    flat(tmp_path / "data", labels)
    err = user_error(fit_argv(tmp_path, "data/labels.csv"), capsys)  # (exit 1, at most 10 lines, no traceback)
    assert "1 of 48 rows hold several labels" in err and "'zero, six'" in err and "data.multi_label: true" in err
    assert not list(tmp_path.rglob("metrics.csv"))  # stopped before training
    run = cli(fit_argv(tmp_path, "data/labels.csv", "--data.init_args.multi_label=true"))
    assert run.model.head.label_kind == "multi" and run.best_checkpoint.monitor == "val_map"
    assert list((tmp_path / "run" / "ckpt").glob("best-*.ckpt"))
