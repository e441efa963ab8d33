"""What the shard tests share: one folder written as shards (with the WebDataset) by `vit shard`, once per suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import built_once
from tests.formats import write_class_folders

# Every common mode, sizes around the 16 px the model sees, and one truncated file.
MODES = ("RGB", "L", "P", "RGBA", "CMYK", "I;16")
OPTS = dict(img_size=16, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, interpolation="bicubic", seed=0)


@pytest.fixture(scope="session")
def sharded(tmp_path_factory) -> tuple[Path, Path, dict]:
    """A single-folder image set (3 classes x 10, one truncated file) and its shards, with the webdataset, written
    by `vit shard`; and the info it returned. Shared: read it, never write into it."""
    from vit.commands.shard import main as shard

    def build(root: Path) -> None:
        folder = root / "photos"
        write_class_folders(folder, ["ant", "bee", "cat"], per_class=10, modes=MODES, size=20)
        good = (folder / "ant" / "img_0.jpg").read_bytes()
        (folder / "bee" / "broken.jpg").write_bytes(good[: len(good) // 2])  # a header that passes, data cut short
        info = shard([str(folder), str(root / "out"), "--webdataset", "--num_workers", "2"])
        (root / "returned.json").write_text(json.dumps(info))

    root = built_once(tmp_path_factory, "sharded", build)
    return root / "photos", root / "out", json.loads((root / "returned.json").read_text())
