"""The scan cache: records survive the round trip through a file that torch.load(weights_only=True) reads."""

from __future__ import annotations

import numpy as np
import torch

from vit.audit.scan import cached_scan_split


class Pictures:
    """An in-memory dataset as `vit.data` defines one: item_name, raw_image and fingerprint (counting reads)."""

    def __init__(self, images: list, key: str = "v1") -> None:
        self.images, self.key, self.reads = images, key, 0

    def item_name(self, index: int) -> str:
        return f"pictures[{index}]"

    def raw_image(self, index: int):
        self.reads += 1
        if self.images[index] is None:
            raise OSError("broken")
        from PIL import Image

        return Image.fromarray(self.images[index])

    def fingerprint(self) -> str:
        return self.key


def test_a_cached_scan_gives_back_every_field_and_reads_no_image(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (20, 24, 3), dtype=np.uint8) for _ in range(5)] + [None]  # the last is bad
    first = Pictures(images)
    scanned, how = cached_scan_split(first, "train", [0, 1, 0, 1, 0, 1], cache_dir=tmp_path)
    assert how.startswith("scanned, cached") and first.reads == 6
    assert scanned[-1].problem and scanned[-1].thumb is None
    assert any(r.phash >= 2**63 for r in scanned) or any(w >= 2**63 for r in scanned for w in r.windows)
    again = Pictures(images)
    loaded, how = cached_scan_split(again, "train", [0, 1, 0, 1, 0, 1], cache_dir=tmp_path)
    assert how.startswith("loaded from cache") and again.reads == 0
    for a, b in zip(scanned, loaded, strict=True):
        thumbs = (a.thumb, b.thumb)
        a.thumb = b.thumb = None
        assert a == b
        assert (thumbs[0] is None and thumbs[1] is None) or np.array_equal(*thumbs)
    # Another fingerprint, other labels or another split is another scan.
    for dataset, labels, split in ((Pictures(images, "v2"), [0, 1, 0, 1, 0, 1], "train"),
                                   (Pictures(images), [1, 1, 0, 1, 0, 1], "train"),
                                   (Pictures(images), [0, 1, 0, 1, 0, 1], "val")):
        assert cached_scan_split(dataset, split, labels, cache_dir=tmp_path)[1].startswith("scanned, cached")


def test_an_unreadable_cache_is_scanned_again_and_a_dataset_without_a_fingerprint_is_not_cached(tmp_path):
    images = [np.full((8, 8, 3), 7, np.uint8)]
    cached_scan_split(Pictures(images), "train", [0], cache_dir=tmp_path)
    (path,) = tmp_path.glob("scan-train-*.pt")
    path.write_bytes(b"not a checkpoint")
    records, how = cached_scan_split(Pictures(images), "train", [0], cache_dir=tmp_path)
    assert how.startswith("scanned, cached") and records[0].width == 8
    assert torch.load(path, weights_only=True)["records"][0]["width"] == 8  # rewritten

    class Unnamed(Pictures):
        fingerprint = None

    assert cached_scan_split(Unnamed(images), "train", [0], cache_dir=tmp_path)[1] == \
        "scanned (not cached: the dataset has no fingerprint())"


def test_a_dataset_whose_files_cannot_all_be_listed_is_scanned_and_says_why_it_was_not_cached(tmp_path):
    class Vanished(Pictures):
        def fingerprint(self) -> str:  # what files_fingerprint raises for a file deleted after the listing
            raise FileNotFoundError(2, "No such file or directory", "photos/a/gone.png")

    records, how = cached_scan_split(Vanished([np.full((8, 8, 3), 7, np.uint8)]), "train", [0], cache_dir=tmp_path)
    assert records[0].width == 8 and how == "scanned (not cached: [Errno 2] No such file or directory: " \
        "'photos/a/gone.png')" and not list(tmp_path.iterdir())
    assert cached_scan_split(Pictures([np.full((8, 8, 3), 7, np.uint8)]), "train", [0], cache_dir=None)[1] == "scanned"
