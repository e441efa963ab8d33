"""`vit.data.files`: the header check shared out across DDP ranks. `ImageFiles`' decoding, replacement and counts
are tested through the DataModules that read with it (tests/data/test_folder.py, test_table.py, test_pool.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.data.test_folder import write_bad_files
from vit.data import ImageFolder
from vit.data.files import check_image_files


def check_headers_on_a_rank(rank: int, world: int, port: int, root: str, out: str) -> None:
    """One DDP rank (gloo on localhost): `check_headers` over ``root``'s files, recording which files this rank
    checked itself, then an ImageFolder set-up; writes what it saw to ``out/rank<rank>.json``."""
    import json

    import torch.distributed as dist

    from vit.data import files

    checked: list[list[str]] = []
    check_files = files.check_image_files

    def recording_check(paths, num_workers=None, short_side=None):
        checked.append(list(paths))
        return check_files(paths, num_workers=num_workers, short_side=short_side)

    files.check_image_files = recording_check  # check_headers calls it by this module's name
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        paths = sorted(str(p) for p in Path(root).rglob("*") if p.is_file())
        bad = files.check_headers(paths)
        try:
            ImageFolder(root, val_fraction=0.3, batch_size=2, num_workers=0, img_size=8).setup("fit")
            error = None
        except ValueError as e:
            error = str(e)
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"checked": checked[0], "bad": bad, "error": error}))


@pytest.mark.slow
def test_under_ddp_each_rank_checks_its_shard_of_headers_and_all_get_every_bad_file(tmp_path):
    import json

    import torch.multiprocessing as mp


    root = tmp_path / "data"
    write_bad_files(root)
    paths = sorted(str(p) for p in root.rglob("*") if p.is_file())
    expected = sorted(map(tuple, check_image_files(paths)))
    assert len(expected) == 3
    shards = [paths[0::2], paths[1::2]]
    assert all(any(path in shard for path, _ in expected) for shard in shards)  # no rank sees them all alone
    port = free_port()
    # forked, not spawned: a spawned rank re-imports torch and vit (seconds each); the check is the same
    mp.start_processes(check_headers_on_a_rank, args=(2, port, str(root), str(tmp_path)), nprocs=2,
                       start_method="fork")
    for rank, shard in enumerate(shards):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["checked"] == shard  # its own share of the files, not all of them
        assert sorted(map(tuple, seen["bad"])) == expected  # everyone's findings
        assert "3 of 16 image files are unreadable" in seen["error"]  # so every rank stops, none waits
