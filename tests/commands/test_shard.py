"""`vit shard` (`vit.commands.shard`): its arguments reach write_shards, and it returns the info it wrote."""

from __future__ import annotations

import json

from vit.commands.shard import parse_args


def test_shard_returns_the_info_it_wrote_with_every_readable_image(sharded):
    folder, out, info = sharded  # `vit shard photos out --webdataset --num_workers 2`
    assert info == json.loads((out / "info.json").read_text())
    readable = sum(1 for p in folder.rglob("*") if p.is_file()) - 1  # all but bee/broken.jpg
    assert sum(info["splits"].values()) == readable == 30 and info["class_names"] == ["ant", "bee", "cat"]
    assert (out / "wds").is_dir()  # --webdataset


def test_shard_options_default_as_data_options_do():
    args = parse_args(["src", "out"])
    assert (args.max_side, args.webdataset, args.val_fraction, args.test_fraction, args.seed) == (
        None, False, 0.1, 0.1, 0)
    assert parse_args(["src", "out", "--max_side", "320", "--webdataset"]).max_side == 320
