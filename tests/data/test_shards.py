"""Writing shards (`vit.data.shards`): the folder's samples, labels and pixels; timm reads the WebDataset export;
re-encoding, resuming an unfinished run, atomic files, EXIF turns. (Streaming them: test_stream.py.)"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests import CONFIGS
from tests.data.conftest import OPTS
from tests.formats import write_class_folders
from vit.data.folder import ImageFolder
from vit.data.shards import write_shards
from vit.data.stream import ImageShards, mixed_seed, seed_transform
from vit.errors import UserPathError


def test_shards_hold_the_folders_samples_labels_and_pixels(sharded):
    folder, out, info = sharded
    assert info["bad_files"][0][0] == "bee/broken.jpg" and len(info["bad_files"]) == 1  # reported, left out
    files = ImageFolder(str(folder), check_images=False, num_workers=0, **OPTS)
    files.setup("fit")  # no header check: the broken file decodes only partly, as in training without the check
    shards = ImageShards(str(out), num_workers=0, **OPTS)
    shards.setup("fit")
    assert shards.class_names == files.class_names == ["ant", "bee", "cat"]
    for split in ("train", "val", "test"):
        wanted = {Path(p).relative_to(folder).as_posix(): label for p, label in getattr(files, f"{split}_set").samples}
        wanted.pop("bee/broken.jpg", None)
        ours = shards.eval_split(split)
        ids = [ours.item_name(i) for i in range(len(ours))]
        assert len(ids) == len(set(ids)) == info["splits"][split] == len(wanted)
        paths = [Path(p).relative_to(folder).as_posix() for p, _ in files.eval_split(split).samples]
        by_path = {path: i for i, path in enumerate(paths)}
        for i, sample_id in enumerate(ids):
            x, y = ours[i]
            fx, fy = files.eval_split(split)[by_path[sample_id]]
            assert y == fy == wanted[sample_id] and torch.equal(x, fx)  # same label, same pixels
    assert shards.class_counts("train") == info["class_counts"]["train"] and sum(info["splits"].values()) == 30
    # the training transform too: under the same seed, the same random crop, flip and RandAugment pixels
    train = shards.train_set
    for i in range(len(train)):
        sample_id = train.item_name(i)
        x, y = train[i]
        seed_transform(mixed_seed(0, train.current_epoch, i))  # the draws train[i] made
        fx, fy = files.train_set[[Path(p).relative_to(folder).as_posix() for p, _ in files.train_set.samples]
                                 .index(sample_id)]
        assert x.dtype == torch.uint8 and torch.equal(x, fx) and y == fy


def test_timm_reads_the_webdataset_export(sharded):
    from timm.data import create_dataset

    _, out, info = sharded
    for split in ("train", "val"):
        ours = ImageShards(str(out), num_workers=0, **OPTS)
        ours.setup("fit")
        plain = ours.eval_split(split)
        stored = {plain.item_name(i): i for i in range(len(plain))}
        theirs = create_dataset("wds/photos", root=str(out / "wds"), split=split, is_training=False, batch_size=1)
        assert len(theirs) == info["splits"][split]
        seen = 0
        for img, label in theirs:  # PIL RGB images and int labels, as timm's wds reader decodes them
            seen += 1
            matches = [i for i in stored.values() if _raw(plain, i)[1] == label and _raw(plain, i)[0] == img.tobytes()]
            assert matches, "every webdataset image is a stored image with its label"
        assert seen == len(stored)
    names = json.loads((out / "wds" / "_info.json").read_text())
    assert names["class_names"] == ["ant", "bee", "cat"]


def _raw(dataset, i: int) -> tuple[bytes, int]:
    from vit.data.shards import decode_sample
    from vit.data.stream import ShardSet

    item = super(ShardSet, dataset).__getitem__(i)
    return decode_sample(item["image"], item["id"]).tobytes(), int(item["label"])


def test_max_side_reencodes_only_larger_images(tmp_path):
    folder = tmp_path / "photos"
    for c, size in (("big", (90, 60)), ("small", (30, 20))):
        (folder / c).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(np.full((size[1], size[0], 3), 25 * i, np.uint8)).save(folder / c / f"{i}.jpg")
    write_shards(folder, tmp_path / "out", max_side=32, num_workers=1)
    dm = ImageShards(str(tmp_path / "out"), num_workers=0, **OPTS)
    dm.setup("fit")
    from vit.data.stream import ShardSet

    for i in range(len(dm.train_set)):
        item = super(ShardSet, dm.train_set).__getitem__(i)
        img = Image.open(io.BytesIO(bytes(item["image"])))
        if item["id"].startswith("big/"):
            assert img.size == (48, 32) and img.format == "JPEG"  # shorter side 60 -> 32, aspect kept
        else:
            assert bytes(item["image"]) == (folder / item["id"]).read_bytes()  # the original bytes


def test_a_second_run_refuses_finished_shards_and_resumes_unfinished_ones(tmp_path, monkeypatch):
    import litdata

    folder = tmp_path / "photos"
    write_class_folders(folder, ["a", "b"], per_class=10, size=16)
    real = litdata.optimize

    def dies_on_val(fn, inputs, output_dir, **kwargs):
        if output_dir.endswith("val"):
            raise KeyboardInterrupt  # as if stopped here
        return real(fn, inputs, output_dir, **kwargs)

    monkeypatch.setattr(litdata, "optimize", dies_on_val)
    with pytest.raises(KeyboardInterrupt):
        write_shards(folder, tmp_path / "out", num_workers=1)
    train_index = tmp_path / "out" / "train" / "index.json"
    written = train_index.stat().st_mtime_ns
    with pytest.raises(UserPathError, match="run it again as it was"):
        write_shards(folder, tmp_path / "out", num_workers=1, max_side=8)
    with pytest.raises(UserPathError, match=r"not found \(an unfinished `vit shard` run"):
        _ = ImageShards(str(tmp_path / "out")).class_names
    monkeypatch.setattr(litdata, "optimize", real)
    info = write_shards(folder, tmp_path / "out", num_workers=1)  # resumes: train is kept
    assert train_index.stat().st_mtime_ns == written and info["splits"] == {"train": 16, "val": 2, "test": 2}
    with pytest.raises(UserPathError, match="already holds finished shards"):
        write_shards(folder, tmp_path / "out", num_workers=1)


def test_the_webdataset_tars_and_the_json_files_are_written_atomically(tmp_path, monkeypatch):
    """A kill while a tar is written once left a torn shard that timm's reader fails on; now each tar, info.json
    and _info.json goes through `save_atomic`, and an interrupted tar leaves nothing under its name."""
    import vit.data.shards as shards

    folder = tmp_path / "photos"
    write_class_folders(folder, ["a", "b"], per_class=10, size=16)
    written = []
    real_save = shards.save_atomic
    monkeypatch.setattr(shards, "save_atomic", lambda write, path: written.append(Path(path)) or real_save(write, path))
    info = write_shards(folder, tmp_path / "out", num_workers=1)
    assert written[-1] == tmp_path / "out" / "info.json" and not list((tmp_path / "out").rglob("*.tmp"))
    real_add, added = shards._add_sample, []

    def dies_on_the_sixth(tar, key, sample):
        added.append(key)
        if len(added) == 6:
            raise KeyboardInterrupt  # as if killed while the second tar is written
        real_add(tar, key, sample)

    monkeypatch.setattr(shards, "_add_sample", dies_on_the_sixth)
    with pytest.raises(KeyboardInterrupt):
        shards.write_webdataset(tmp_path / "out", info, samples_per_tar=4)
    assert sorted(p.name for p in (tmp_path / "out" / "wds").iterdir()) == ["train-000000.tar"]  # whole, or none
    monkeypatch.setattr(shards, "_add_sample", real_add)
    written.clear()
    shards.write_webdataset(tmp_path / "out", info, samples_per_tar=4)
    assert sorted(written) == sorted((tmp_path / "out" / "wds").iterdir())  # every tar and _info.json


def test_writing_counts_samples_as_workers_handle_them_and_is_quiet(tmp_path, monkeypatch, capfd):
    import contextlib

    import vit.data.shards as shards

    folder = tmp_path / "photos"
    write_class_folders(folder, ["a", "b"], per_class=25, size=16)
    seen = []

    @contextlib.contextmanager
    def recording(count, total, description):  # what the bar would show once the split is written
        yield
        seen.append((description, count(), total))

    monkeypatch.setattr(shards, "progress_while", recording)
    monkeypatch.setattr(shards, "PROGRESS_EVERY", 4)  # the forked workers inherit it
    write_shards(folder, tmp_path / "out", num_workers=2)
    assert [d for d, _, _ in seen] == ["train: shards", "val: shards", "test: shards"]
    assert sum(total for _, _, total in seen) == 50
    _, counted, total = seen[0]
    assert total - 2 * 4 < counted <= total  # each of the 2 workers noted every 4th sample it handled
    assert not (tmp_path / "out" / ".progress").exists()
    printed = capfd.readouterr()
    assert "Create an account" not in printed.out + printed.err and "Worker" not in printed.out + printed.err


@pytest.mark.parametrize("path", sorted(p for p in CONFIGS.rglob("*.yaml") if "vit.data.ImageShards" in p.read_text()),
                         ids=lambda p: p.stem)
def test_every_shard_recipe_builds_its_datamodule_from_its_yaml_and_streams(path, sharded):
    """The recipe's own data options (its augmentation included) over local shards; the URL and cache swapped."""
    import yaml
    from jsonargparse import ArgumentParser
    from lightning.pytorch import LightningDataModule

    data = yaml.safe_load(path.read_text())["data"]
    data["init_args"].update(root=str(sharded[1]), num_workers=0, batch_size=4, cache_dir=None)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningDataModule, "data")
    dm = parser.instantiate_classes(parser.parse_object({"data": data})).data
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.dtype == torch.uint8 and x.shape == (4, 3, dm.img_size, dm.img_size) and y.max() < 3


def test_a_phones_portrait_photo_is_shown_turned_in_shards_and_in_the_webdataset(tmp_path):
    """A photo stored 60x40 with EXIF orientation 6 shows 40x60. Re-encoded (--max_side, which keeps no EXIF, and
    the webdataset for timm, whose reader ignores EXIF) it must be stored as shown, or it trains on its side."""
    import tarfile

    from vit.data.shards import decode_sample
    from vit.data.stream import ShardSet

    folder = tmp_path / "photos"
    write_class_folders(folder, ["a", "b"], per_class=6, size=20)
    exif = Image.Exif()
    exif[0x0112] = 6
    pixels = np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / "a" / "portrait.jpg", exif=exif, quality=95)
    for max_side, shown in ((None, (40, 60)), (32, (32, 48))):
        out = tmp_path / f"out_{max_side}"
        write_shards(folder, out, max_side=max_side, webdataset=True, num_workers=1)
        items = []
        for split in ("train", "val", "test"):
            stored = ShardSet(str(out / split), None)
            items += [super(ShardSet, stored).__getitem__(i) for i in range(len(stored))]
        item = next(item for item in items if item["id"] == "a/portrait.jpg")
        assert decode_sample(item["image"], item["id"]).size == shown
        members = {}
        for tar in sorted((out / "wds").glob("*.tar")):
            with tarfile.open(tar) as t:
                members.update({m.name: t.extractfile(m).read() for m in t.getmembers()})
        key = next(name[:-5] for name, data in members.items()
                   if name.endswith(".json") and json.loads(data)["id"] == "a/portrait.jpg")
        with Image.open(io.BytesIO(members[f"{key}.jpg"])) as img:  # as timm's reader opens it: no EXIF turn
            assert img.size == shown and img.getexif().get(0x0112, 1) == 1
