"""`vit shard SRC OUT`: write an image folder as streaming shards for `vit.data.ImageShards`.

LitData's optimized format (read from a folder or an s3:// / gs:// copy of OUT), and with --webdataset
also WebDataset tars that timm's ``create_dataset("wds/...", root=OUT/wds)`` reads. See `vit.data.shards`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line of `vit shard`."""
    parser = argparse.ArgumentParser(
        prog="vit shard", description="Write an image folder (class folders, or train/val[/test] of them) as "
        "streaming shards: original bytes, class index and path of every image; class names and split sizes in "
        "OUT/info.json. A second run over an unfinished OUT resumes it; a finished OUT is refused.")
    parser.add_argument("src", help="image folder: SRC/<class>/<image> or SRC/train|val[|test]/<class>/<image>")
    parser.add_argument("out", help="output folder (new or empty); copy it to object storage to stream from there")
    parser.add_argument("--max_side", type=int, default=None,
                        help="re-encode images whose shorter side is larger to this many pixels (e.g. 320)")
    parser.add_argument("--webdataset", action="store_true", help="also write OUT/wds: tar shards + timm's _info.json")
    parser.add_argument("--val_fraction", type=float, default=0.1, help="single-folder layout: share held for val")
    parser.add_argument("--test_fraction", type=float, default=0.1, help="single-folder layout: share held for test")
    parser.add_argument("--seed", type=int, default=0, help="seed of the single-folder split (as data.seed)")
    parser.add_argument("--num_workers", type=int, default=None, help="processes (default: the CPU cores, at most 16)")
    parser.add_argument("--chunk_bytes", default="64MB", help="size of a LitData chunk (default 64MB)")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str]) -> dict[str, Any]:
    """Run `vit shard` with the given arguments (without the command name); returns the shards' info."""
    from vit.data.shards import write_shards

    args = parse_args(argv)
    info = write_shards(args.src, args.out, max_side=args.max_side, webdataset=args.webdataset,
                        val_fraction=args.val_fraction, test_fraction=args.test_fraction, seed=args.seed,
                        num_workers=args.num_workers, chunk_bytes=args.chunk_bytes)
    sizes = ", ".join(f"{n} {split}" for split, n in info["splits"].items())
    print(f"{args.out}: {sizes} images, {len(info['class_names'])} classes; {len(info['bad_files'])} bad files "
          "left out" + (f"; WebDataset tars in {args.out}/wds" if args.webdataset else ""))
    return info
