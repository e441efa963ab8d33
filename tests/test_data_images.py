"""DataModules on data written in their real on-disk formats."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from _images import write_cifar10, write_cifar100, write_class_folders
from PIL import Image

from vit.data import CIFAR, Digits, ImageFolder, ImageNet
from vit.data.images import load_image, stratified_split, to_rgb


def test_stratified_split_keeps_class_shares_and_is_seeded():
    labels = np.repeat(np.arange(4), [10, 20, 30, 40])
    rest, val, test = stratified_split(labels, [0.1, 0.2], seed=3)
    assert sorted(np.concatenate([rest, val, test]).tolist()) == list(range(100))
    assert Counter(labels[val].tolist()) == {0: 1, 1: 2, 2: 3, 3: 4}
    assert Counter(labels[test].tolist()) == {0: 2, 1: 4, 2: 6, 3: 8}
    again = stratified_split(labels, [0.1, 0.2], seed=3)
    assert all((a == b).all() for a, b in zip(again, (rest, val, test)))
    other = stratified_split(labels, [0.1, 0.2], seed=4)
    assert not (other[1] == val).all()


def test_digits_split_sizes_batches_and_metadata():
    dm = Digits(batch_size=32)
    # known before setup, so the CLI can link them into the model
    assert (dm.num_classes, dm.img_size, dm.in_chans) == (10, 8, 1)
    assert dm.class_names == [str(i) for i in range(10)]
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (1259, 179, 359)
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (32, 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    # the eval images are the scikit-learn pixels / 16, normalised
    from sklearn.datasets import load_digits

    digits = load_digits()
    _, val_idx, test_idx = stratified_split(digits.target, [0.1, 0.2], seed=0)
    expected = (torch.tensor(digits.images[val_idx[:32]], dtype=torch.float32) / 16 - 0.3053) / 0.3760
    torch.testing.assert_close(x[:, 0], expected)
    assert Counter(digits.target[test_idx].tolist()) == Counter(
        dm.test_set.labels.tolist()
    )
    # training images are augmented (shifted/rotated), so two draws differ
    a, b = dm.train_set[0][0], dm.train_set[0][0]
    assert not torch.equal(a, b)
    # upsampled digits keep the split and their mean brightness
    big = Digits(img_size=16, augment=False)
    big.setup("fit")
    x16 = big.val_set[0][0]
    assert x16.shape == (1, 16, 16) and big.img_size == 16
    assert x16.mean().item() == pytest.approx(dm.val_set[0][0].mean().item(), abs=0.1)
    with pytest.raises(ValueError, match="at least the native 8"):
        Digits(img_size=4)


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "CMYK", "I;16", "1", "LA"])
def test_every_common_mode_becomes_rgb(mode, tmp_path):
    from _images import MODE_FILES, image_in_mode

    img = image_in_mode(mode, size=10, seed=1)
    path = tmp_path / f"x{MODE_FILES[mode]}"
    img.save(path)
    rgb = load_image(path)
    assert rgb.mode == "RGB" and rgb.size == (10, 10)
    if mode == "I;16":
        # 16-bit values are rescaled, not clipped at 255
        raw = np.asarray(Image.open(path), dtype=np.float64)
        expected = np.clip(raw / 65535 * 255 + 0.5, 0, 255).astype(np.uint8)
        np.testing.assert_array_equal(np.asarray(rgb)[..., 0], expected)
        assert len(np.unique(np.asarray(rgb))) > 50
    if mode == "L":
        np.testing.assert_array_equal(np.asarray(rgb)[..., 1], np.asarray(Image.open(path)))


def test_to_rgb_palette_with_transparency():
    img = Image.new("P", (4, 4))
    img.putpalette([255, 0, 0] * 256)
    img.info["transparency"] = 0
    assert to_rgb(img).getpixel((0, 0)) == (255, 0, 0)


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


def test_cifar10_reads_python_pickles_and_carves_val(tmp_path):
    written = write_cifar10(tmp_path)
    dm = CIFAR(str(tmp_path), variant=10, val_size=20, batch_size=8, num_workers=0, crop_pct=1.0)
    assert dm.num_classes == 10 and dm.class_names[0] == "airplane"
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (80, 20, 20)
    assert Counter(dm.train_set.dataset.targets[i] for i in dm.val_set.indices) == {c: 2 for c in range(10)}
    # the test images are the pickled pixels, row-major CHW, normalised with CIFAR mean/std
    data, labels = written["test_batch"]
    x, y = dm.test_set[3]
    expected = torch.tensor(data[3].reshape(3, 32, 32), dtype=torch.float32) / 255
    mean, std = torch.tensor(dm.mean).view(3, 1, 1), torch.tensor(dm.std).view(3, 1, 1)
    torch.testing.assert_close(x, (expected - mean) / std, atol=1e-5, rtol=0)
    assert y == labels[3]
    xb, _ = next(iter(dm.train_dataloader()))
    assert xb.shape == (8, 3, 32, 32)


def test_cifar100_fine_labels(tmp_path):
    write_cifar100(tmp_path)
    dm = CIFAR(str(tmp_path), variant=100, val_size=100, num_workers=0)
    assert dm.num_classes == 100 and dm.class_names[-1] == "worm"
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (100, 100, 100)
    assert dm.test_set[42][1] == 42


def test_cifar_missing_files_offline_names_folder_and_files(tmp_path):
    dm = CIFAR(str(tmp_path), variant=10, download=False, num_workers=0)
    with pytest.raises(FileNotFoundError) as err:
        dm.setup("fit")
    message = str(err.value)
    assert str(tmp_path / "cifar-10-batches-py") in message
    assert "data_batch_1" in message and "test_batch" in message and "batches.meta" in message
    assert "download: true" in message
