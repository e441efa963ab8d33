"""What every image DataModule shares: the splits as evaluation sees them."""

from __future__ import annotations

import pytest
import torch

from tests.formats import write_cifar10, write_class_folders
from vit.data import CIFAR, Digits, ImageFolder
from vit.data.base import drops_last_batch


def datamodule(kind: str, tmp_path):
    """A set-up DataModule of each family."""
    if kind == "digits":
        dm = Digits(img_size=16)
    elif kind == "folder":
        write_class_folders(tmp_path, ["a", "b"], per_class=6, modes=("RGB", "L", "RGBA"), size=40)
        dm = ImageFolder(str(tmp_path), img_size=32, num_workers=0)
    else:
        write_cifar10(tmp_path)
        dm = CIFAR(str(tmp_path), val_size=20, num_workers=0)
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("kind", ["digits", "folder", "cifar"])
def test_eval_split_gives_the_training_images_without_augmentation(kind, tmp_path):
    dm = datamodule(kind, tmp_path)
    train = dm.eval_split("train")
    assert len(train) == len(dm.train_set)
    torch.manual_seed(0)
    augmented = [dm.train_set[i][0] for i in range(3)]
    again = [dm.train_set[i][0] for i in range(3)]
    assert any(not torch.equal(a, b) for a, b in zip(augmented, again))  # training draws new augmentations
    for i in range(3):
        x, y = train[i]
        assert torch.equal(x, train[i][0]) and int(y) == int(dm.train_set[i][1])
        assert x.shape == (dm.in_chans, dm.img_size, dm.img_size)
    if kind == "digits":  # the stored pixels, normalised, as val and test are prepared
        torch.testing.assert_close(train[0][0], (dm.train_set.images[0] - dm.train_set.mean) / dm.train_set.std)
        assert dm.train_set.transform is not None  # the training split itself still augments
    else:  # the evaluation transform, as val and test use
        assert repr(train.transform) == repr(dm.val_set.transform) != repr(dm.train_set.transform)
    assert dm.eval_split("val") is dm.val_set and dm.eval_split("test") is dm.test_set


def test_eval_split_before_setup_says_so():
    with pytest.raises(RuntimeError, match="no train split; was setup"):
        Digits().eval_split("train")


@pytest.mark.parametrize("images, batches", [(100, 2), (70, 1), (128, 2), (40, 1)])
def test_training_loader_drops_only_a_last_batch_under_half_a_batch(images, batches, tmp_path):
    # 100 at batch 64: the last 36 train (dropping them left 36% of the folder out of every epoch);
    # 70: a last batch of 6 is dropped (a noisy step at the full lr); 40: one batch, smaller than the batch size.
    write_class_folders(tmp_path / "train", ["a", "b"], per_class=images // 2, size=8)
    write_class_folders(tmp_path / "val", ["a", "b"], per_class=1, size=8)
    dm = ImageFolder(str(tmp_path), img_size=8, batch_size=64, num_workers=0)
    dm.setup("fit")
    assert len(dm.train_set) == images
    sizes = [len(y) for _, y in dm.train_dataloader()]
    assert len(sizes) == batches and sum(sizes) == {100: 100, 70: 64, 128: 128, 40: 40}[images]


def test_the_drop_last_rule_counts_each_ranks_share_of_the_images(tmp_path):
    """Under DDP each rank trains on its share of the images, and the rule looks at that share's last batch:
    100 images at batch 32 over 2 ranks are 50 a rank, a last batch of 18 (>= 16) that trains; one process
    would see a last batch of 4 (< 16) and drop it."""
    from types import SimpleNamespace

    from torch.utils.data import DataLoader, DistributedSampler

    write_class_folders(tmp_path / "train", ["a", "b"], per_class=50, size=8)
    write_class_folders(tmp_path / "val", ["a", "b"], per_class=1, size=8)
    dm = ImageFolder(str(tmp_path), img_size=8, batch_size=32, num_workers=0)
    dm.setup("fit")
    dm.trainer = SimpleNamespace(world_size=2, training=False)  # a trainer stand-in: two ranks
    loader = dm.train_dataloader()
    assert loader.drop_last is False
    for rank in (0, 1):  # what Lightning makes of it under DDP: the same loader with a DistributedSampler
        sampler = DistributedSampler(dm.train_set, num_replicas=2, rank=rank, shuffle=False)
        ranked = DataLoader(dm.train_set, batch_size=32, sampler=sampler, drop_last=loader.drop_last)
        assert [len(y) for _, y in ranked] == [32, 18]
    dm.trainer = SimpleNamespace(world_size=1, training=False)
    assert dm.train_dataloader().drop_last is True  # the control: one process drops its last 4


@pytest.mark.parametrize(("num_samples", "batch_size", "drops"), [
    (90, 64, True),    # a last batch of 26 < 32: dropped
    (95, 64, True),    # 31: just under half
    (96, 64, False),   # 32: half a batch is kept
    (100, 64, False),  # 36 of 100 images would be a big share of a small folder
    (128, 64, False),  # no partial batch
    (40, 64, False),   # under one batch: the only batch is never dropped
    (64, 64, False),
    (65, 64, True),    # one image over a batch
])
def test_drops_last_batch_only_under_half_a_batch(num_samples, batch_size, drops):
    assert drops_last_batch(num_samples, batch_size) is drops
