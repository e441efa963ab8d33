"""HFDataset (vit.data.hub): Hugging Face data (save_to_disk, Hub-layout Parquet, hf:// from the Hub cache) gives the
class-folder path's run bit for bit; its columns, labels and splits; bad rows, wrong columns and an uncached hf://
each a short message."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import seed_everything

from tests.data.hf_formats import dataset, digits, png, write_folder, write_hub_cache, write_parquet
from tests.helpers import quick_trainer, tiny_classifier
from vit.data import ImageFolder
from vit.data.hub import HFDataset
from vit.errors import UserError

pytest.importorskip("datasets")
OPTS = dict(img_size=8, batch_size=16, num_workers=0)
NAMES = [str(i) for i in range(10)]


def fit_and_test(data, root: Path, seed: int = 0) -> tuple[dict, list[dict]]:
    seed_everything(seed)
    model = tiny_classifier(num_classes=10, in_chans=3, img_size=8)
    trainer = quick_trainer(root, max_epochs=2, deterministic=True)
    trainer.fit(model, datamodule=data)
    return model.state_dict(), trainer.test(model, datamodule=data, verbose=False)


@pytest.fixture(scope="module")
def three_ways(tmp_path_factory) -> dict:
    """The digits as class folders and written three ways, the rows in the folder's sorted order."""
    root = tmp_path_factory.mktemp("hf")
    images, labels = digits(20)
    paths = write_folder(root / "folder", images, labels)
    dataset(images, labels, NAMES).save_to_disk(str(root / "disk"))
    strings = dataset(images, [str(x) for x in labels])
    write_parquet(root / "parquet", {"train": strings})
    write_hub_cache(root / "home", "vit-tests/digits", {"train": strings})
    return {"root": root, "paths": paths, "labels": labels}


def test_digits_three_ways_give_the_class_folders_run_bit_for_bit(three_ways, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(three_ways["root"] / "home"))
    folder = ImageFolder(str(three_ways["root"] / "folder"), **OPTS)
    weights, tested = fit_and_test(folder, tmp_path / "folder")
    row_of = {p: i for i, p in enumerate(three_ways["paths"])}
    for root in (three_ways["root"] / "disk", three_ways["root"] / "parquet", "hf://vit-tests/digits"):
        data = HFDataset(str(root), **OPTS)
        assert data.class_names == folder.class_names == NAMES
        got, got_tested = fit_and_test(data, tmp_path / "hf")
        for split in ("train", "val", "test"):  # the same rows as the folder's files, in the same order
            ours, theirs = getattr(data, f"{split}_set").samples, getattr(folder, f"{split}_set").samples
            assert [(r, label) for r, label in ours] == [(row_of[p], label) for p, label in theirs]
        assert all(torch.equal(weights[k], got[k]) for k in weights), root
        assert got_tested == tested and "test_acc" in tested[0]
    other, _ = fit_and_test(HFDataset(str(three_ways["root"] / "disk"), **{**OPTS, "seed": 1}), tmp_path / "o", 1)
    assert not all(torch.equal(weights[k], other[k]) for k in weights)  # the check tells runs apart


def test_the_data_splits_are_used_and_validation_is_val(tmp_path):
    images, labels = digits(6)
    ds = dataset(images, labels, NAMES)
    write_parquet(tmp_path / "p", {"train": ds.select(range(0, 60, 2)), "validation": ds.select(range(1, 60, 4)),
                                   "test": ds.select(range(3, 60, 4))})
    data = HFDataset(str(tmp_path / "p"), **OPTS)
    data.setup("fit")
    assert (len(data.train_set), len(data.val_set), len(data.test_set)) == (30, 15, 15)
    assert data.val_set.item_name(0).startswith("val row ")
    assert data.state_dict()["data_source"]["kind"] == "parquet"


def test_multi_label_sequences_of_classlabel_and_lists_of_strings_give_the_same_targets(tmp_path):
    images, _ = digits(2)
    rows = [[i % 3] if i % 4 else [0, 2] for i in range(len(images))]
    names = ["a", "b", "c"]
    dataset(images, rows, names, multi=True).save_to_disk(str(tmp_path / "seq"))
    write_parquet(tmp_path / "str", {"train": dataset(images, [[names[k] for k in r] for r in rows], multi=True)})
    expected = np.zeros((len(rows), 3), np.float32)
    for i, r in enumerate(rows):
        expected[i, r] = 1
    for root in ("seq", "str"):
        data = HFDataset(str(tmp_path / root), **{**OPTS, "val_fraction": 0.2, "test_fraction": 0.2})
        data.setup("fit")
        assert data.multi_label and data.class_names == names
        for split in ("train", "val", "test"):
            part = getattr(data, f"{split}_set")
            assert np.array_equal(part.labels.numpy(), expected[[r for r, _ in part.samples]])


def test_bad_rows_of_each_kind_end_in_a_few_lines_naming_the_row(tmp_path, caplog):
    images, labels = digits(3)
    images[4] = b"not an image at all"
    texts = [str(x) for x in labels]
    texts[7], texts[11] = "", "eleven"
    write_parquet(tmp_path / "p", {"train": dataset(images, texts)})
    with pytest.raises(UserError) as e:
        HFDataset(str(tmp_path / "p"), classes=NAMES, **OPTS).setup("fit")
    lines = str(e.value).splitlines()
    assert len(lines) <= 10 and "2 of 30 rows are bad (1 empty label, 1 unknown class)" in lines[0]
    assert "train row 7: empty label" in str(e.value) and "train row 11: unknown class: 'eleven'" in str(e.value)
    data = HFDataset(str(tmp_path / "p"), classes=NAMES, skip_bad_rows=True, **OPTS)
    with pytest.raises(UserError) as e:  # the header check finds the undecodable row
        data.setup("fit")
    assert "train row 4: undecodable image" in str(e.value) and len(str(e.value).splitlines()) <= 10
    data = HFDataset(str(tmp_path / "p"), classes=NAMES, skip_bad_rows=True, skip_bad_images=True, **OPTS)
    data.setup("fit")
    kept = {r for part in (data.train_set, data.val_set, data.test_set) for r, _ in part.samples}
    assert kept == set(range(30)) - {4, 7, 11}


def test_a_wrong_column_lists_the_columns_and_an_uncached_hf_name_offline_fails_in_one_line(tmp_path, monkeypatch):
    images, labels = digits(2)
    dataset(images, labels, NAMES).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(UserError, match=r"no column 'lable' \(data.label_column\); its columns: \['image', 'label'\]"):
        HFDataset(str(tmp_path / "d"), label_column="lable", **OPTS).setup("fit")
    with pytest.raises(UserError, match=r"no column 'img' \(data.image_column\); its columns: \['image', 'label'\]"):
        HFDataset(str(tmp_path / "d"), image_column="img", **OPTS).setup("fit")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as e:
        HFDataset("hf://someone/digits@v2", **OPTS).setup("fit")
    assert len(str(e.value).splitlines()) == 1
    assert "hf download someone/digits --repo-type dataset --revision v2" in str(e.value)


def test_an_image_saved_by_path_reads_its_file(tmp_path):
    import datasets

    images, labels = digits(2)
    files = write_folder(tmp_path / "files", images, labels)
    ds = datasets.Dataset.from_dict({"image": files, "label": labels},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "label": datasets.ClassLabel(names=NAMES)}))
    ds.save_to_disk(str(tmp_path / "d"))
    data = HFDataset(str(tmp_path / "d"), **OPTS)
    data.setup("fit")
    image, label = data.val_set[0]
    row = data.val_set.samples[0][0]
    assert label == labels[row] and os.path.isfile(files[row]) and image.shape == (3, 8, 8)
    assert png  # (the module's helpers)


def test_vit_fit_with_the_scratch_recipe_reads_hub_parquet_unchanged_and_the_card_names_the_data(three_ways, tmp_path,
                                                                                                 monkeypatch):
    """configs/scratch_small.yaml names ImageFolder; given hf://, `vit fit` reads it with HFDataset. The checkpoint
    keeps the data's name and revision, and the model card's front matter names it under ``datasets:``."""
    from tests.conftest import quiet_run
    from tests.helpers import TINY_DIM
    from tests.test_errors import SCRATCH
    from vit.cli.main import cli
    from vit.deploy.card import card_data, run_facts

    monkeypatch.setenv("HF_HOME", str(three_ways["root"] / "home"))
    run = cli(["fit", *quiet_run(tmp_path, SCRATCH), "--data.init_args.root=hf://vit-tests/digits",
               "--data.init_args.num_workers=0", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
               "--trainer.limit_val_batches=1", "--test_after_fit=false",
               f"--model.init_args.model_kwargs={{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2}}"])
    assert type(run.datamodule).__name__ == "HFDataset" and run.datamodule.class_names == NAMES
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    facts = run_facts(last, tmp_path / "ckpt" / "last.ckpt", run=tmp_path)
    assert facts.dataset["name"] == "vit-tests/digits" and facts.dataset["revision"] == "0123456789abcdef" * 2 + \
        "01234567"
    front = card_data(None, facts, "vit_small", "digits").to_dict()
    assert front["datasets"] == ["vit-tests/digits"]


def test_vit_fit_on_an_uncached_hf_name_offline_fails_in_one_line(tmp_path, monkeypatch, capsys):
    from tests.test_errors import SCRATCH, user_error

    monkeypatch.setenv("HF_HOME", str(tmp_path / "nothing"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = user_error(["fit", "--config", SCRATCH, "--data.init_args.root", "hf://someone/digits"], capsys)
    line = next(x for x in err.splitlines() if "hf download" in x)
    assert "hf://someone/digits is not in the local Hub cache" in line
    assert "`hf download someone/digits --repo-type dataset`" in line


def test_rows_interleaved_across_classes_are_ordered_and_split_as_the_class_folders(three_ways, tmp_path):
    """Rows dealt class by class in turn (each class's rows still in the folder's order) come out in the folder
    path's order, so the seeded split takes the same images in the same order."""
    labels = three_ways["labels"]
    images, _ = digits(20)
    order = sorted(range(len(labels)), key=lambda i: (i % 20, labels[i]))  # 0, 20, 40, ...: one of each class
    write_parquet(tmp_path / "p", {"train": dataset([images[i] for i in order], [labels[i] for i in order], NAMES)})
    folder = ImageFolder(str(three_ways["root"] / "folder"), **OPTS)
    data = HFDataset(str(tmp_path / "p"), **OPTS)
    folder.setup("fit")
    data.setup("fit")
    row_of = {p: i for i, p in enumerate(three_ways["paths"])}
    for split in ("train", "val", "test"):
        ours, theirs = getattr(data, f"{split}_set").samples, getattr(folder, f"{split}_set").samples
        assert [(order[r], label) for r, label in ours] == [(row_of[p], label) for p, label in theirs]


def test_vit_audit_reads_hub_data_as_it_reads_the_class_folders(three_ways, tmp_path):
    """`vit audit` on a save_to_disk folder counts what it counts on the same digits as class folders."""
    from tests.commands.test_audit import audit_args
    from vit.commands import run

    got = {}
    for kind in ("folder", "disk"):
        out = tmp_path / kind
        run(audit_args(three_ways["root"] / kind, out, tmp_path / f"cache-{kind}", "--no_labels", "--data.img_size",
                       "8"))
        got[kind] = json.loads((out / "summary.json").read_text())["inventory"]
    assert got["disk"]["images"] == got["folder"]["images"] == len(three_ways["labels"])
    for key in ("images_per_split", "images_per_class"):
        assert got["disk"][key] == got["folder"][key], key
