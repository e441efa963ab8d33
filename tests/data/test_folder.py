"""Your own class folders and ImageNet: layouts, modes, non-images, corrupt files."""

from __future__ import annotations

import logging
import re
import warnings
import zlib
from collections import Counter
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.formats import random_rgb, write_class_folders
from vit.data.folder import ImageFolder, ImageNet
from vit.errors import UserPathError, UserValueError


def test_imagefolder_single_folder_mixed_modes_and_non_images(tmp_path, caplog):
    root = tmp_path / "pets"
    modes = ["RGB", "L", "P", "RGBA", "CMYK", "I;16"]
    write_class_folders(root, ["cat", "dog", "eel"], per_class=10, modes=modes)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "dog" / "labels.csv").write_text("a,b")
    (root / "dog" / "more.txt").write_text("x")
    with caplog.at_level(logging.WARNING, logger="vit.data.io"):
        dm = ImageFolder(str(root), val_fraction=0.2, test_fraction=0.2, batch_size=4, num_workers=0,
                         img_size=16, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25)
        assert dm.class_names == ["cat", "dog", "eel"] and dm.num_classes == 3
        dm.setup("fit")
    assert re.search(r"skipped 3 files .* not images \(2 \.txt, 1 \.csv\)", caplog.text)
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (18, 6, 6)
    assert Counter(label for _, label in dm.val_set.samples) == {0: 2, 1: 2, 2: 2}
    x, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 16, 16) and torch.isfinite(x).all()
    # every mode goes through the eval transform too
    for i in range(len(dm.val_set)):
        assert dm.val_set[i][0].shape == (3, 16, 16)


@pytest.mark.usefixtures("without_pillow_heif")
def test_jpegs_named_jfif_or_jpe_and_avif_photos_train_and_heic_is_named_with_what_to_do(tmp_path, caplog):
    """.jfif (how Windows browsers save JPEGs), .jpe and .avif are formats PIL reads: they were skipped as "not
    images". HEIC (iPhones) PIL cannot read without pillow-heif: skipped, and the warning, or the error for a class
    of nothing else, says to convert them."""
    from PIL import features

    from vit.data.io import find_images, load_image

    assert features.check("avif"), "this Pillow reads no AVIF (its wheels do since 11.3)"
    root = tmp_path / "shop"
    for c, name in enumerate(["mug", "pen"]):
        (root / name).mkdir(parents=True)
        for i, (ext, fmt) in enumerate([(".jfif", "JPEG"), (".JPE", "JPEG"), (".avif", "AVIF"), (".png", "PNG")] * 2):
            random_rgb(24, seed=10 * c + i).save(root / name / f"{i}{ext}", fmt)
        (root / name / "IMG_0001.HEIC").write_bytes(b"\x00\x00\x00\x18ftypheic" + bytes(64))
    with caplog.at_level(logging.WARNING, logger="vit.data.io"):
        dm = ImageFolder(str(root), val_fraction=0.25, test_fraction=0, batch_size=4, num_workers=0, img_size=16)
        dm.setup("fit")
    assert len(dm.train_set) + len(dm.val_set) == 16  # every .jfif, .JPE, .avif and .png
    assert re.search(r"skipped 2 files .* not images \(2 \.heic\); PIL does not read \.heic photos .* convert them "
                     "to JPEG or PNG", caplog.text)
    x, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 16, 16)
    assert load_image(root / "mug" / "0.jfif").size == (24, 24)
    found = find_images([root / "mug"])
    assert len(found.files) == 8 and "PIL does not read .heic photos" in found.describe_skipped()[0]
    (root / "pen" / "IMG_0002.heic").write_bytes(b"\x00\x00\x00\x18ftypheic" + bytes(64))
    for path in (root / "pen").glob("[0-9]*"):
        path.unlink()
    with pytest.raises(UserValueError, match=r"class folder .*pen has no images .*; PIL does not read \.heic photos"):
        ImageFolder(str(root), batch_size=4, num_workers=0, img_size=16).setup("fit")


def test_with_pillow_heif_an_iphones_heic_photos_train(tmp_path):
    """The test environment has the optional pillow-heif (the dev extra): .heic files are then images like any
    other, in training and in evaluation."""
    from vit.data.io import find_images, load_image

    root = tmp_path / "shop"
    for c, name in enumerate(["mug", "pen"]):
        (root / name).mkdir(parents=True)
        for i in range(4):
            random_rgb(24, seed=10 * c + i).save(root / name / f"IMG_{i:04d}.HEIC", "HEIF", quality=95)
    dm = ImageFolder(str(root), val_fraction=0.25, test_fraction=0, batch_size=4, num_workers=0, img_size=16)
    dm.setup("fit")
    assert len(dm.train_set) == 6 and len(dm.val_set) == 2
    assert next(iter(dm.train_dataloader()))[0].shape == (4, 3, 16, 16)
    assert next(iter(dm.val_dataloader()))[0].shape == (2, 3, 16, 16)
    assert load_image(root / "mug" / "IMG_0000.HEIC").size == (24, 24)
    assert len(find_images([root]).files) == 8


def test_the_validation_folder_may_be_named_valid_or_validation(tmp_path):
    """Roboflow exports train/valid/test, some Kaggle sets train/validation: "has train/ but no val/ folder". The
    validation split is read from either. With none of the three, val_fraction of train/ is held out."""
    from vit.data import UnlabelledFolder

    for name, per_class in (("valid", 2), ("validation", 3)):
        root = tmp_path / name
        write_class_folders(root / "train", ["ant", "bee"], per_class=4)
        write_class_folders(root / name, ["ant", "bee"], per_class=per_class, seed=100)
        write_class_folders(root / "test", ["ant", "bee"], per_class=1, seed=200)
        dm = ImageFolder(str(root), batch_size=2, num_workers=0, img_size=16)
        dm.setup("fit")
        assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (8, 2 * per_class, 2)
        assert {Path(path).parts[-3] for path, _ in dm.val_set.samples} == {name}
        unlabelled = UnlabelledFolder(str(root), batch_size=2, num_workers=0, img_size=16)
        unlabelled.setup("fit")
        assert (len(unlabelled.train_set), len(unlabelled.val_set)) == (8, 2 * per_class)
    # train/ and test/ alone (as many datasets come): val_fraction of each class of train/ is held out
    (tmp_path / "valid" / "valid").rename(tmp_path / "valid" / "dev")
    dm = ImageFolder(str(tmp_path / "valid"), val_fraction=0.25, batch_size=2, num_workers=0, img_size=16)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (6, 2, 2)
    assert Counter(label for _, label in dm.val_set.samples) == {0: 1, 1: 1}
    assert not {path for path, _ in dm.val_set.samples} & {path for path, _ in dm.train_set.samples}


def test_a_val_folder_of_images_without_class_folders_is_named_with_imagenets_way_out(tmp_path):
    """ImageNet's val as distributed is 50,000 flat JPEGs: "val has no class sub-folders". The error now says it
    holds images but no labels, and for ILSVRC2012_val_* files how to sort them."""
    write_class_folders(tmp_path / "train", ["n01440764", "n01443537"], per_class=2)
    (tmp_path / "val").mkdir()
    for i in range(1, 4):
        random_rgb(seed=i).save(tmp_path / "val" / f"ILSVRC2012_val_{i:08d}.JPEG")
    with pytest.raises(UserValueError, match=r"val holds 3 images but no class folders, so they have no labels.*"
                       r"ImageNet's validation images come this way.*valprep\.sh"):
        ImageNet(str(tmp_path), num_workers=0).setup("fit")
    for path in (tmp_path / "val").iterdir():
        path.rename(tmp_path / "val" / path.name.replace("ILSVRC2012_val_", "photo_"))
    with pytest.raises(UserValueError, match=r"val holds 3 images but no class folders, so they have no labels: "
                       r"expected .*val/<class name>/<image files>\.$"):
        ImageFolder(str(tmp_path), num_workers=0).setup("fit")
    # the same for a root of images alone (a single-folder layout needs class folders too)
    with pytest.raises(UserValueError, match=r"holds 3 images but no class folders, so they have no labels"):
        ImageFolder(str(tmp_path / "val"), num_workers=0).setup("fit")


def test_a_folder_that_leaves_nothing_to_validate_on_is_an_error_that_says_why(tmp_path):
    """One image a class (or an empty val/): the run trained on, with Lightning's warnings that val_acc was never
    logged, saved no best checkpoint and tested on nothing. Now setup says why there is no validation."""
    write_class_folders(tmp_path / "one", ["a", "b", "c"], per_class=1)
    with pytest.raises(UserValueError, match=r"no image is left to validate on \(a class needs two images to give "
                       r"one to validation, and 3 of the 3 classes have one\)"):
        ImageFolder(str(tmp_path / "one"), num_workers=0).setup("fit")
    write_class_folders(tmp_path / "split" / "train", ["a", "b"], per_class=3)
    (tmp_path / "split" / "val" / "a").mkdir(parents=True)
    with pytest.raises(UserValueError, match=r"no image is left to validate on \(its validation folder holds no "
                       r"images\)"):
        ImageFolder(str(tmp_path / "split"), num_workers=0).setup("fit")


def test_a_root_that_is_an_archive_or_a_file_is_named_as_such(tmp_path):
    """`--data.init_args.root photos.zip` said "image folder not found: photos.zip", beside the file itself."""
    import shutil

    from vit.data import UnlabelledFolder

    write_class_folders(tmp_path / "photos", ["a", "b"], per_class=2)
    zipped = Path(shutil.make_archive(str(tmp_path / "photos"), "zip", tmp_path / "photos"))
    tarred = Path(shutil.make_archive(str(tmp_path / "shots"), "gztar", tmp_path / "photos"))
    with pytest.raises(UserPathError, match=rf"photos\.zip is an archive, not a folder: extract it and give the "
                       rf"folder \(e\.g\. `unzip {re.escape(str(zipped))} -d {re.escape(str(tmp_path / 'photos'))}`\)"):
        ImageFolder(str(zipped), num_workers=0).setup("fit")
    with pytest.raises(UserPathError, match=r"shots\.tar\.gz is an archive, not a folder: .*`mkdir .*shots && tar xf"):
        UnlabelledFolder(str(tarred), num_workers=0).setup("fit")
    image = sorted((tmp_path / "photos" / "a").iterdir())[0]
    with pytest.raises(UserPathError, match=rf"{re.escape(image.name)} is a file; give the folder that holds the"):
        ImageFolder(str(image), num_workers=0).setup("fit")
    with pytest.raises(UserPathError, match=r"image folder not found: .*missing"):
        ImageFolder(str(tmp_path / "missing"), num_workers=0).setup("fit")


def png_header(width: int, height: int) -> bytes:
    """A PNG whose valid header claims ``width`` x ``height`` pixels (a decompression bomb's first bytes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])  # 8-bit grayscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def write_bad_files(root):
    """Three bad files a header check finds (empty, text, absurd size), and a truncated JPEG it cannot."""
    write_class_folders(root, ["a", "b"], per_class=6)
    (root / "a" / "empty.jpg").write_bytes(b"")
    (root / "a" / "notes.jpg").write_text("a text file named .jpg")
    (root / "b" / "huge.png").write_bytes(png_header(60000, 60000))
    truncated = root / "b" / "truncated.jpg"  # a whole header, then the pixel data stops half way
    random_rgb(size=64, seed=9).save(truncated, quality=95)
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    return truncated


def test_an_image_too_elongated_to_resize_is_named_at_setup(tmp_path):
    """A 3-kB PNG of 2,000,000 x 1 pixels: the crop's enlargement (short side to 16) or the evaluation resize (to
    ceil(16 / 0.875) = 19) would make it 38,000,000 x 19; its MemoryError came from a loader worker mid-epoch."""
    write_class_folders(tmp_path / "train", ["a", "b"], per_class=3)
    write_class_folders(tmp_path / "val", ["a", "b"], per_class=1)
    Image.new("L", (2_000_000, 1)).save(tmp_path / "train" / "a" / "strip.png")
    Image.new("L", (2_000, 1)).save(tmp_path / "train" / "b" / "short_strip.png")  # 38,000 x 19: fine
    options = dict(batch_size=2, num_workers=0, img_size=16, crop_pct=0.875)
    with pytest.raises(ValueError) as err:
        ImageFolder(str(tmp_path), **options).setup("fit")
    assert ("strip.png: 2000000x1: scaling its short side to the model's 19 pixels would make it 722,000,000 "
            "pixels, over the limit of 40,000,000; crop it to a less elongated shape") in str(err.value)
    assert "short_strip.png" not in str(err.value)
    dm = ImageFolder(str(tmp_path), skip_bad_images=True, **options)
    dm.setup("fit")
    assert len(dm.train_set) == 7 and not any(p.endswith("/strip.png") for p, _ in dm.train_set.samples)


def test_bad_headers_are_all_reported_at_setup_before_any_step(tmp_path):
    root = tmp_path / "data"
    write_bad_files(root)
    dm = ImageFolder(str(root), val_fraction=0.3, batch_size=2, num_workers=0, img_size=8)
    with pytest.raises(ValueError) as err:
        dm.setup("fit")
    message = str(err.value)
    assert "3 of 16 image files are unreadable" in message and "skip_bad_images" in message
    assert "empty.jpg: empty file" in message and "notes.jpg: not an image" in message
    assert "huge.png: 3,600,000,000 pixels, over PIL's limit" in message and "truncated.jpg" not in message

    dm = ImageFolder(str(root), val_fraction=0.3, batch_size=2, num_workers=0, img_size=8, skip_bad_images=True)
    dm.setup("fit")
    paths = [p for p, _ in dm.train_set.samples + dm.val_set.samples + dm.test_set.samples]
    assert len(paths) == 13 and not any(name in p for p in paths for name in ("empty", "notes", "huge"))


def test_undecodable_image_is_named_with_the_option_or_replaced_and_counted(tmp_path):
    root = tmp_path / "data"
    truncated = write_bad_files(root)
    for bad in ("empty.jpg", "notes.jpg"):
        (root / "a" / bad).unlink()
    (root / "b" / "huge.png").unlink()
    dm = ImageFolder(str(root), val_fraction=0.01, test_fraction=0.0, batch_size=2, num_workers=0, img_size=8)
    dm.setup("fit")
    index = [p for p, _ in dm.train_set.samples].index(str(truncated))
    with pytest.raises(OSError, match=r"truncated\.jpg.*; set data\.skip_bad_images: true"):
        dm.train_set[index]

    dm = ImageFolder(str(root), val_fraction=0.01, test_fraction=0.0, batch_size=2, num_workers=0, img_size=8,
                     skip_bad_images=True, max_bad_fraction=0.1)
    dm.setup("fit")
    dataset = dm.train_set
    index = [p for p, _ in dataset.samples].index(str(truncated))
    image, label = dataset[index]
    assert label == dm.class_names.index("b") and image.shape == (3, 8, 8)
    assert dataset.replacements() == (1, [str(truncated)])
    dataset[index]
    assert dataset.replacements() == (2, [str(truncated)])  # counted per load, listed once
    dataset.max_bad_fraction = 0.05  # 5% of 11 files: under one, and one bad file is always tolerated
    dataset[index]
    dataset.failures[index - 1 if index else index + 1] += 1  # a second file fails: more than 5% tolerates
    with pytest.raises(OSError, match=r"2 of 11 images could not be decoded, more than max_bad_fraction=0.05 "
                       r"tolerates here \(1 of 11\)"):
        dataset[index]


@pytest.mark.slow
def test_replacements_in_loader_workers_are_counted_and_reported(tmp_path, caplog):
    """Workers are other processes: their replacements reach the epoch report through shared memory."""
    from lightning.pytorch import Trainer

    from vit.cli.training import TrainingReport
    from vit.tasks import ImageClassifier

    root = tmp_path / "data"
    truncated = write_bad_files(root)
    # 9 training images in batches of 3: the training loader drops no last partial batch, so every epoch
    # meets the truncated file whatever the shuffle (batches of 4 left one image out, now and then that one)
    dm = ImageFolder(str(root), val_fraction=0.2, test_fraction=0.0, batch_size=3, num_workers=2, img_size=16,
                     skip_bad_images=True, max_bad_fraction=0.5)
    model = ImageClassifier(model="vit_tiny_patch16_224", num_classes=2, img_size=16,
                            model_kwargs={"depth": 1, "patch_size": 8})
    trainer = Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[TrainingReport()], num_sanity_val_steps=0)
    with caplog.at_level(logging.WARNING, logger="vit.cli.training"):
        trainer.fit(model, datamodule=dm)
    assert caplog.text.count("replaced 1 undecodable images") == 2 and str(truncated) in caplog.text
    assert trainer.callback_metrics["replaced_images"] == 1


def test_imagefolder_errors_on_empty_class_and_unknown_val_class(tmp_path):
    root = tmp_path / "one"
    write_class_folders(root, ["a", "b"], per_class=3)
    (root / "empty").mkdir()
    dm = ImageFolder(str(root), num_workers=0)
    with pytest.raises(ValueError, match=r"class folder .*empty has no images"):
        dm.setup("fit")

    split = tmp_path / "split"
    write_class_folders(split / "train", ["a", "b"], per_class=3)
    write_class_folders(split / "val", ["a", "c"], per_class=2)
    with pytest.raises(ValueError, match=r"val has classes that .*train lacks: \['c'\]"):
        ImageFolder(str(split)).setup("fit")  # the folder is read at setup, not in the constructor
    with pytest.raises(FileNotFoundError, match="image folder not found"):
        ImageFolder(str(tmp_path / "nowhere")).setup("fit")


@pytest.mark.parametrize("train_form", ["NFC", "NFD"])
def test_class_folders_spelt_in_another_unicode_form_are_the_same_class(tmp_path, train_form):
    """train/ written on Linux (NFC: "é" is one code point), val/ and test/ unzipped from a Mac (NFD: "e" and a
    combining accent), or the other way round: the same classes as a person reads them, not "val has classes
    that train lacks", nor a KeyError."""
    import unicodedata

    other_form = {"NFC": "NFD", "NFD": "NFC"}[train_form]
    trains, others = (unicodedata.normalize(form, "café") for form in (train_form, other_form))
    assert trains != others
    write_class_folders(tmp_path / "train", [trains, "tea"], per_class=3)
    for split in ("val", "test"):
        write_class_folders(tmp_path / split, ["tea", others], per_class=2)
    dm = ImageFolder(str(tmp_path), num_workers=0, img_size=8)
    dm.setup("fit")
    assert dm.class_names == [trains, "tea"]
    assert {(Path(path).parent.name, label) for path, label in dm.train_set.samples} == {(trains, 0), ("tea", 1)}
    for dataset in (dm.val_set, dm.test_set):
        assert {(Path(path).parent.name, label) for path, label in dataset.samples} == {(others, 0), ("tea", 1)}


def test_the_folders_users_bring_neighbouring_the_plain_layouts(tmp_path, monkeypatch, caplog):
    """A class named train, the __MACOSX folder of a zip made on a Mac, a ~ in the root, a link loop, a class of
    two images and an empty val class folder: each once stopped a run or trained on something else."""
    vehicles = tmp_path / "vehicles"
    write_class_folders(vehicles, ["bus", "car", "train"], per_class=10)
    write_class_folders(vehicles / "__MACOSX", ["bus"], per_class=1)  # resource forks, beside the classes
    write_class_folders(vehicles / "car" / "__MACOSX", ["car"], per_class=1)  # and inside them
    write_class_folders(vehicles, ["rare"], per_class=2)
    (vehicles / "bus" / "up").symlink_to("..")  # a link back up to the root: a loop
    (vehicles / "car" / "gone.jpg").symlink_to(tmp_path / "deleted.jpg")  # a link to a deleted photo
    monkeypatch.setenv("HOME", str(tmp_path))
    dm = ImageFolder("~/vehicles", num_workers=0, img_size=8, skip_bad_images=True)  # as a YAML value reaches us
    with caplog.at_level(logging.WARNING):
        dm.setup("fit")
    assert dm.root == vehicles and not dm.split_folders
    assert dm.class_names == ["bus", "car", "rare", "train"]
    assert dm.class_counts("train")[dm.class_names.index("rare")] == 1  # of 2, not 0: one went to val
    samples = [path for split in (dm.train_set, dm.val_set, dm.test_set) for path, _ in split.samples]
    assert len(samples) == len(set(samples)) == 32 and not any("__MACOSX" in p or "/up/" in p for p in samples)
    assert "bus/up: it leads back to" in caplog.text  # said, and read once
    assert "gone.jpg" in caplog.text  # the dead link is named as a bad file, not dropped without a word

    split = tmp_path / "split"
    write_class_folders(split / "train", ["a", "b"], per_class=3)
    write_class_folders(split / "val", ["a"], per_class=2)
    (split / "val" / "b").mkdir()  # an empty class folder in val means what a missing one does
    dm = ImageFolder(str(split), num_workers=0, img_size=8)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set)) == (6, 2)
    (split / "train" / "c").mkdir()  # but not in train: a class with nothing to learn from
    with pytest.raises(ValueError, match=r"class folder .*train.c has no images"):
        ImageFolder(str(split), num_workers=0).setup("fit")


def test_imagefolder_train_val_test_layout(tmp_path):
    root = tmp_path / "split"
    write_class_folders(root / "train", ["a", "b", "c"], per_class=4)
    write_class_folders(root / "val", ["a", "b", "c"], per_class=2)
    write_class_folders(root / "test", ["b", "c"], per_class=1)  # a test set may lack a class
    dm = ImageFolder(str(root), num_workers=0, batch_size=3, img_size=8)
    dm.setup("test")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (12, 6, 2)
    # labels follow train's class list even where a class is missing
    assert sorted(label for _, label in dm.test_set.samples) == [1, 2]


def test_imagenet_jpeg_folders(tmp_path):
    root = tmp_path / "imagenet"
    wnids = ["n01440764", "n01443537", "n01484850"]
    write_class_folders(root / "train", wnids, per_class=4, size=40)
    write_class_folders(root / "val", wnids, per_class=2, size=40)
    dm = ImageNet(str(root), batch_size=4, num_workers=0, img_size=32)
    assert dm.class_names == wnids and dm.crop_pct == 0.875 and dm.auto_augment.startswith("rand-m9")
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 32, 32)
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (4, 3, 32, 32) and y.tolist() == [0, 0, 1, 1]
    with pytest.raises(FileNotFoundError, match=r"imagenet2.val not found; expected .*train/<class>"):
        write_class_folders(tmp_path / "imagenet2" / "train", wnids, per_class=1)
        ImageNet(str(tmp_path / "imagenet2")).setup("fit")




def test_balanced_sampling_draws_an_imbalanced_folder_about_evenly(tmp_path):
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    root = tmp_path / "data"
    write_class_folders(root / "many", [""], per_class=100, size=8)
    write_class_folders(root / "few", [""], per_class=10, size=8, seed=100)
    dm = ImageFolder(str(root), val_fraction=0.2, test_fraction=0.0, num_workers=0, img_size=8, balanced_sampling=True,
                     check_images=False)
    dm.setup("fit")
    assert dm.class_counts("train") == [8, 80]  # classes sort: few, many (exactly 10%: no warning yet)
    labels = torch.as_tensor(dm.train_set.labels)
    draws = torch.cat([labels[list(dm.train_dataloader().sampler)] for _ in range(50)])
    assert abs(draws.float().mean().item() - 0.5) < 0.03  # about 50/50, not 10/90
    for rank in (0, 1):  # as Lightning shards a custom sampler under DDP
        shard = DistributedSamplerWrapper(dm.train_sampler(), num_replicas=2, rank=rank, shuffle=True)
        drawn = torch.cat([labels[list(shard)] for _ in range(50)])
        assert abs(drawn.float().mean().item() - 0.5) < 0.04
    for path in sorted((root / "few").iterdir())[:5]:
        path.unlink()  # 5 of 100: under 10%
    plain = ImageFolder(str(root), val_fraction=0.2, test_fraction=0.0, num_workers=0, img_size=8, check_images=False)
    with pytest.warns(UserWarning, match=r"imbalanced classes: 'few' has 4 training images, under 10% of .* 80"):
        plain.setup("fit")
    evened = ImageFolder(str(root), val_fraction=0.2, test_fraction=0.0, num_workers=0, img_size=8,
                         balanced_sampling=True, check_images=False)
    with warnings.catch_warnings():  # the advice's own option on: said as done, not advised again
        warnings.filterwarnings("error", message=".*imbalanced")
        evened.setup("fit")
    assert plain.train_sampler() is None



def test_printing_a_datamodule_before_setup_claims_nothing_about_its_test_split(tmp_path, caplog):
    """LightningDataModule.__str__ calls every loader method, set up or not (jsonargparse formats one in a
    debug line while linking): before setup, there is nothing to say about the test split."""
    write_class_folders(tmp_path / "data", ["a", "b"], per_class=5)
    dm = ImageFolder(str(tmp_path / "data"), test_fraction=0.0, num_workers=0)
    with caplog.at_level(logging.WARNING, logger="vit.data.folder"):
        str(dm)
    assert "no test split" not in caplog.text
    dm.setup("fit")
    with caplog.at_level(logging.WARNING, logger="vit.data.folder"):
        dm.test_dataloader()
    assert "no test split is held out" in caplog.text
