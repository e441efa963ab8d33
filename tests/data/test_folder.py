"""Your own class folders and ImageNet: layouts, modes, non-images, corrupt files."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.formats import write_class_folders
from vit.data import ImageFolder, ImageNet
from vit.data.io import load_image


def test_imagefolder_single_folder_mixed_modes_and_non_images(tmp_path):
    root = tmp_path / "pets"
    modes = ["RGB", "L", "P", "RGBA", "CMYK", "I;16"]
    write_class_folders(root, ["cat", "dog", "eel"], per_class=10, modes=modes)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "dog" / "labels.csv").write_text("a,b")
    (root / "dog" / "more.txt").write_text("x")
    with pytest.warns(UserWarning, match=r"skipped 3 files .* not images \(2 \.txt, 1 \.csv\)"):
        dm = ImageFolder(str(root), val_fraction=0.2, test_fraction=0.2, batch_size=4, num_workers=0,
                         img_size=16, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25)
        assert dm.class_names == ["cat", "dog", "eel"] and dm.num_classes == 3
        dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (18, 6, 6)
    assert Counter(label for _, label in dm.val_set.samples) == {0: 2, 1: 2, 2: 2}
    x, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 16, 16) and torch.isfinite(x).all()
    # every mode goes through the eval transform too
    for i in range(len(dm.val_set)):
        assert dm.val_set[i][0].shape == (3, 16, 16)


def test_imagefolder_corrupt_image_is_named_or_skipped(tmp_path):
    root = tmp_path / "data"
    write_class_folders(root, ["a", "b"], per_class=5)
    bad = root / "a" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    good = root / "b" / "img_0.jpg"
    truncated = root / "b" / "truncated.jpg"
    truncated.write_bytes(good.read_bytes()[:200])

    dm = ImageFolder(str(root), val_fraction=0.4, batch_size=2, num_workers=0, img_size=8)
    dm.setup("fit")
    everything = dm.train_set.samples + dm.val_set.samples
    for path, _ in everything:
        if path in (str(bad), str(truncated)):
            with pytest.raises(OSError, match=path.replace("\\", "\\\\")):
                load_image(path)
    dataset = dm.train_set if any(p == str(bad) for p, _ in dm.train_set.samples) else dm.val_set
    index = [p for p, _ in dataset.samples].index(str(bad))
    with pytest.raises(OSError, match=r"broken\.jpg"):
        dataset[index]

    with pytest.warns(UserWarning, match="skipped 2 unreadable images"):
        dm = ImageFolder(str(root), val_fraction=0.4, batch_size=2, num_workers=0, img_size=8,
                         skip_bad_images=True)
        dm.setup("fit")
    paths = [p for p, _ in dm.train_set.samples + dm.val_set.samples]
    assert len(paths) == 10 and str(bad) not in paths and str(truncated) not in paths


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
        ImageFolder(str(split))
    with pytest.raises(FileNotFoundError, match="image folder not found"):
        ImageFolder(str(tmp_path / "nowhere"))


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
        ImageNet(str(tmp_path / "imagenet2"))


