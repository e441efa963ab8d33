"""CIFAR-10/100 read from pickles in torchvision's on-disk format."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.formats import write_cifar10, write_cifar100
from vit.data.cifar import CIFAR


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


def test_cifar_from_the_extracted_folder_itself_or_from_an_archive_fetched_by_hand(tmp_path):
    """`root: data/cifar-10-batches-py` (the extracted folder, not its parent) looked for
    cifar-10-batches-py/cifar-10-batches-py; `root/cifar-10-python.tar.gz`, downloaded by hand for an offline
    machine, was "not found" unless download: true. Both now read the same images; a truncated archive is named."""
    import shutil
    import tarfile

    written = write_cifar10(tmp_path / "data")
    extracted = tmp_path / "data" / "cifar-10-batches-py"
    dm = CIFAR(str(extracted), variant=10, val_size=20, num_workers=0)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.test_set)) == (80, 20)

    offline = tmp_path / "offline"
    offline.mkdir()
    with tarfile.open(offline / "cifar-10-python.tar.gz", "w:gz") as archive:
        archive.add(extracted, arcname="cifar-10-batches-py")
    dm = CIFAR(str(offline), variant=10, val_size=20, num_workers=0)
    dm.prepare_data()  # what a Trainer calls first (on one process per machine)
    dm.setup("fit")
    assert (offline / "cifar-10-batches-py" / "test_batch").is_file()
    data, labels = written["test_batch"]
    plain = CIFAR(str(offline), variant=10, val_size=20, num_workers=0, mean=(0, 0, 0), std=(1, 1, 1))
    plain.setup("fit")
    image, label = plain.test_set[5]
    assert label == labels[5]
    torch.testing.assert_close(image, torch.tensor(data[5].reshape(3, 32, 32), dtype=torch.float32) / 255)

    shutil.rmtree(offline / "cifar-10-batches-py")
    whole = (offline / "cifar-10-python.tar.gz").read_bytes()
    (offline / "cifar-10-python.tar.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cifar-10-python.tar.gz cannot be extracted .* download it again"):
        CIFAR(str(offline), variant=10, num_workers=0).setup("fit")
