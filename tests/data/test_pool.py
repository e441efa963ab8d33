"""The unlabelled pool beside a labelled folder: read once per epoch, in every worker, resumed bitwise, sharded."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import LightningModule

from tests.formats import write_class_folders
from tests.helpers import quick_trainer, random_images
from vit.data import ImageFolder
from vit.data.pool import PoolSampler
from vit.errors import UserPathError, UserValueError

POOL = 24


@pytest.fixture
def folders(tmp_path) -> tuple[Path, Path]:
    write_class_folders(tmp_path / "labelled", ["a", "b"], per_class=10, size=12)
    random_images(tmp_path / "pool" / "deep" / "er", POOL // 2, size=(12, 12), mode="RGB")
    random_images(tmp_path / "pool", POOL // 2, size=(12, 12), mode="RGB", seed=100)
    return tmp_path / "labelled", tmp_path / "pool"


def datamodule(folders, views=("train",), num_workers=0, **kwargs) -> ImageFolder:
    labelled, pool = folders
    dm = ImageFolder(str(labelled), unlabelled_root=str(pool), img_size=8, batch_size=4, num_workers=num_workers,
                     **kwargs)
    dm.trainer = SimpleNamespace(lightning_module=SimpleNamespace(unlabelled_views=views), global_rank=0,
                                 world_size=1, training=True)
    dm.setup("fit")
    return dm


def epoch_batches(loader, epoch: int) -> list[list[torch.Tensor]]:
    loader.sampler.set_epoch(epoch)  # as Lightning does each epoch
    return list(loader)


def test_each_epoch_reads_every_pool_image_once_and_each_rank_its_own_share():
    for world in (1, 2, 5):
        shards = [PoolSampler(POOL + 1, 3, seed=0, rank=r, world=world, pool_batch=None) for r in range(world)]
        for epoch in (0, 1):
            read = [i for s in shards for b in range(3) for _, i in s.members(epoch, b)]
            assert sorted(set(read)) == list(range(POOL + 1))  # every image, on some rank
            assert len(read) == world * -(-(POOL + 1) // world)  # once, but for the few that pad the last rank
    # with a ratio, a stream of passes: one pass of 25 at 2 a batch, 3 batches an epoch, spans epochs 0..4
    stream = PoolSampler(POOL + 1, 3, seed=0, pool_batch=2)
    read = [m for e in range(5) for b in range(3) for m in stream.members(e, b)][: POOL + 1]
    assert sorted(i for _, i in read) == list(range(POOL + 1)) and {p for p, _ in read} == {0}
    assert PoolSampler(POOL, 3, seed=0).members(0, 0) != PoolSampler(POOL, 3, seed=0).members(1, 0)  # reshuffled



@pytest.mark.parametrize("pool_batch", [None, 2])
def test_an_epochs_batches_name_it_so_no_two_epochs_draw_the_same_crops(pool_batch):
    """Each pool image's crop is seeded from (seed, pass, index): an epoch's batches must carry that epoch and
    read its own pass (one pass an epoch), or the next part of the stream (a ratio); a (pass, index) drawn twice
    is the same crop of the same image twice."""
    sampler, drawn = PoolSampler(POOL, 3, seed=0, pool_batch=pool_batch), []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert [(e, b) for e, b, _ in batches] == [(epoch, b) for b in range(3)]
        drawn += [m for _, _, members in batches for m in members]
        if pool_batch is None:
            assert {p for p, _ in drawn[-POOL:]} == {epoch}
    assert len(set(drawn)) == len(drawn)  # 72 draws of pass 0-2, or 18 of pass 0: none twice

def test_every_worker_yields_pool_batches_the_same_as_one_process(folders):
    dm = datamodule(folders)
    labelled_batches = dm._labelled_batches()
    assert labelled_batches == 4  # 16 train images at 4 a batch
    straight = epoch_batches(dm.pool_loader(labelled_batches), 1)
    parallel = epoch_batches(datamodule(folders, num_workers=2).pool_loader(labelled_batches), 1)
    assert {int(batch[-1][2]) for batch in parallel} == {0, 1}  # both workers made batches
    assert sum(len(batch[0]) for batch in straight) == POOL  # the whole pool, once
    for one, two in zip(straight, parallel, strict=True):
        assert one[0].dtype == torch.uint8 and one[0].shape[1:] == (3, 8, 8)
        assert torch.equal(one[0], two[0])  # the draws are the sample's, not the worker's


@pytest.mark.parametrize("workers", [0, 2])
def test_a_restored_position_resumes_the_epoch_at_the_next_batch_bitwise(folders, workers):
    """With workers too: a worker loader's first iterator calls iter(sampler) twice (torch 2.14.1); a sampler that
    took the position at the first call resumed the epoch at its batch 0."""
    dm = datamodule(folders)
    straight = epoch_batches(dm.pool_loader(4), 2)
    for batch in straight[:3]:  # the model saw three batches of epoch 2, then the run was killed
        dm.on_after_batch_transfer({"labelled": [torch.zeros(1, 3, 8, 8, dtype=torch.uint8), 0],
                                    "unlabelled": batch}, 0)
    saved = dm.state_dict()
    assert saved["unlabelled_position"] == [2, 3]
    resumed = datamodule(folders, num_workers=workers)
    resumed.load_state_dict(saved)
    loader = resumed.pool_loader(4)
    rest = epoch_batches(loader, 2)
    assert len(rest) == 1 and all(torch.equal(a[0], b[0]) for a, b in zip(rest, straight[3:], strict=True))
    assert len(epoch_batches(loader, 3)) == 4  # the next epoch is whole again
    fresh = datamodule(folders)
    fresh.load_state_dict({"unlabelled_position": [1, 4]})  # saved at epoch 1's end: epoch 2 starts at its start
    assert torch.equal(epoch_batches(fresh.pool_loader(4), 2)[0][0], straight[0][0])



def test_a_restored_position_names_its_epoch_before_set_epoch_is_called(folders):
    """Lightning (2.6) builds a resumed run's first iterator before it calls set_epoch: the position says the epoch."""
    straight = {epoch: epoch_batches(datamodule(folders).pool_loader(4), epoch) for epoch in (1, 2)}
    for saved, epoch, first in (([1, 4], 2, 0), ([1, 2], 1, 2)):  # epoch 1 done; 2 batches of epoch 1 done
        resumed = datamodule(folders)
        resumed.load_state_dict({"unlabelled_position": saved})
        rest = list(resumed.pool_loader(4))  # no set_epoch: the sampler's own epoch is still 0
        assert [int(b[-1][0]) for b in rest] == [epoch] * (4 - first)
        assert all(torch.equal(a[0], b[0]) for a, b in zip(rest, straight[epoch][first:], strict=True))

def test_two_views_are_drawn_in_order_from_one_image_and_finished_per_view(folders):
    one = epoch_batches(datamodule(folders).pool_loader(4), 0)
    dm = datamodule(folders, views=("train", "strong"))
    two = epoch_batches(dm.pool_loader(4), 0)
    assert len(two[0]) == 3  # two views and the position
    assert torch.equal(one[0][0], two[0][0])  # the first view is the same draw as a single view's
    assert not torch.equal(two[0][0], two[0][1])
    out = dm.on_after_batch_transfer({"labelled": [torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4)],
                                      "unlabelled": two[0]}, 0)
    assert [v.dtype for v in out["unlabelled"]] == [torch.float32] * 2 and len(out["unlabelled"]) == 2
    assert out["labelled"][0].dtype == torch.float32


def test_pool_errors_are_one_line(folders, tmp_path):
    labelled, _ = folders
    (tmp_path / "empty").mkdir()
    for root, error, words in ((tmp_path / "missing", UserPathError, "missing"),
                               (tmp_path / "empty", UserValueError, "holds no image files")):
        dm = datamodule((labelled, root))
        with pytest.raises(error, match=words) as caught:
            dm.pool_loader(4)
        assert "\n" not in str(caught.value)
    with pytest.raises(UserValueError, match="trains on labelled images only"):
        datamodule(folders, views=()).pool_loader(4)
    with pytest.raises(UserValueError, match="unlabelled_ratio"):
        datamodule((labelled, random_images(tmp_path / "few", 2, mode="RGB")[0].parent)).pool_loader(4)


class PoolReader(LightningModule):
    """Reads both parts of every training batch, and records what it got."""

    unlabelled_views = ("weak", "strong")

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[tuple] = []

    def training_step(self, batch, batch_idx):
        (images, labels), (weak, strong) = batch["labelled"], batch["unlabelled"]
        self.seen.append((images.dtype, len(labels), weak.shape, strong.dtype))
        return self.layer(weak.mean().reshape(1, 1)).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_fit_hands_the_task_labelled_and_pool_batches_together(folders, tmp_path):
    dm = ImageFolder(str(folders[0]), unlabelled_root=str(folders[1]), img_size=8, batch_size=4, num_workers=0)
    task = PoolReader()
    quick_trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(task, datamodule=dm)
    assert len(task.seen) == 4  # the labelled loader's batches; the pool split over them
    assert {s[0] for s in task.seen} == {torch.float32} and {s[3] for s in task.seen} == {torch.float32}
    assert sum(s[2][0] for s in task.seen) == POOL
    assert dm.state_dict()["unlabelled_position"] == [1, 0]  # epoch 0 is done: saved as epoch 1's start


def test_the_bad_file_guard_covers_the_pool(folders):
    (folders[1] / "empty.png").write_bytes(b"")
    with pytest.raises(UserValueError, match=r"empty\.png"):
        datamodule(folders).pool_loader(4)
    dm = datamodule(folders, skip_bad_images=True)
    assert sum(len(batch[0]) for batch in epoch_batches(dm.pool_loader(4), 0)) == POOL
