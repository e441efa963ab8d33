"""A dataset of image files, and the header check of many files at once (sharded across DDP ranks).

`ImageFiles` is what every file-backed DataModule reads through (class folders, labels tables, Hugging Face rows
decoded from bytes, the unlabelled pool): decoding, EXIF orientation, grey and palette images made RGB, and a
file that fails to decode named, or with ``replace_bad`` replaced by the next good image of its class and counted.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from PIL import Image, ImageOps
from torch.utils.data import Dataset

from vit.data.fast import FastTrainTransform
from vit.data.fingerprint import files_fingerprint
from vit.data.io import check_image_files, exif_orientation, load_image, open_image
from vit.errors import UserError


class UndecodableImageError(UserError, OSError):
    """An image whose header is fine but whose pixel data cannot be decoded (found while loading)."""


class ImageFiles(Dataset):
    """(path, label) samples decoded to RGB and transformed. The training transform (`FastTrainTransform`) gets
    each file opened but not decoded and decodes it itself: a JPEG much larger than its crop at a fraction of
    its size.

    A file that fails to decode raises an error naming it; with ``replace_bad`` it is replaced by the next decodable
    image of its class instead. Failures are counted per file in shared memory, so the counts of all DataLoader
    workers add up; once more than ``max_bad_fraction`` of the files have failed, loading stops with an error.
    """

    def __init__(
        self, samples: Sequence[tuple[str, int]], transform: Callable | None = None, *,
        replace_bad: bool = False, max_bad_fraction: float = 0.01, short_side: int | None = None,
    ) -> None:
        self.samples = list(samples)
        self.transform = transform
        self.short_side = short_side  # the evaluation transform's resize: a large JPEG decodes at that scale
        self.replace_bad = replace_bad
        self.max_bad_fraction = max_bad_fraction
        self.failures = torch.zeros(len(self.samples), dtype=torch.int32).share_memory_()  # per file
        self.same_class: dict[int, list[int]] = defaultdict(list)
        for index, (_, label) in enumerate(self.samples):
            self.same_class[self.group(label)].append(index)

    def group(self, label: Any) -> Any:
        """Which images may stand in for an undecodable one of ``label``: those of its class."""
        return label

    def source(self, path: Any) -> Any:
        """What a sample's path opens as: the file (`vit.data.hub` gives an Arrow row's bytes)."""
        return path

    def __len__(self) -> int:
        return len(self.samples)

    def tolerated(self) -> int:
        """How many undecodable files ``replace_bad`` replaces before it stops: ``max_bad_fraction`` of them,
        and at least one (on a small folder, one bad file is already over 1%)."""
        return max(1, int(self.max_bad_fraction * len(self.samples)))

    @property
    def labels(self) -> list[int]:
        """The label of every sample, without decoding any image."""
        return [label for _, label in self.samples]

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        try:
            if isinstance(self.transform, FastTrainTransform):  # it decodes: a big JPEG at a fraction of its size
                with open_image(self.source(path)) as img:
                    return self.transform(img), label
            img = load_image(self.source(path), short_side=self.short_side)
        except OSError as e:
            if not self.replace_bad:
                raise UndecodableImageError(
                    f"{e}; set data.skip_bad_images: true to train on with another image of its class in its place "
                    f"(up to {self.tolerated()} of these {len(self)} files, data.max_bad_fraction="
                    f"{self.max_bad_fraction:g}).\nIts header is fine: only decoding finds this. `vit audit` with "
                    "the same --config and --data.init_args.root lists every such file."
                ) from e
            img, label = self._replacement(index)
        return (self.transform(img) if self.transform else img), label

    def _replacement(self, index: int) -> tuple[Any, Any]:
        """The next decodable image of ``index``'s class, and its label; counts every file that failed."""
        self.failures[index] += 1
        bad_files = int((self.failures > 0).sum())
        if bad_files > self.tolerated():
            files = [self.samples[i][0] for i in self.failures.nonzero().flatten().tolist()]
            raise UndecodableImageError(
                f"{bad_files} of {len(self.samples)} images could not be decoded, more than "
                f"max_bad_fraction={self.max_bad_fraction:g} tolerates here ({self.tolerated()} of {len(self)}); "
                f"first: {', '.join(files[:5])}\n`vit audit` with the same --config and --data.init_args.root "
                "lists every file that fails to decode: remove or fix them, or raise data.max_bad_fraction."
            )
        group = self.same_class[self.group(self.samples[index][1])]
        start = group.index(index)
        for other in group[start + 1:] + group[:start]:
            if not self.failures[other]:
                try:
                    return load_image(self.source(self.samples[other][0]), short_side=self.short_side), \
                        self.samples[other][1]
                except OSError:
                    self.failures[other] += 1
        raise UndecodableImageError(f"no image of the class of {self.samples[index][0]} can be decoded; `vit audit` "
                                    "with the same --config and --data.init_args.root lists the files that fail")

    def fingerprint(self) -> str:
        """A hash of the files (paths, labels, sizes, modification times) and the transform."""
        return files_fingerprint(type(self).__name__, self.transform, self.samples)

    def item_name(self, index: int) -> str:
        """The file of item ``index``."""
        return self.samples[index][0]

    def raw_image(self, index: int) -> Image.Image:
        """Item ``index`` decoded in its own mode, untransformed, ``.format`` set: as stored, but turned as its EXIF
        orientation says, as training sees it (`vit audit` then finds a phone's tagged original beside its upright
        export)."""
        with Image.open(self.source(self.samples[index][0])) as img:
            turned = exif_orientation(img) != 1
            img.load()
        if not turned:
            return img
        shown = ImageOps.exif_transpose(img)
        shown.format = img.format
        return shown

    def replacements(self) -> tuple[int, list[str]]:
        """How many times an image was replaced so far (all workers together), and the files that failed."""
        failed = self.failures.nonzero().flatten().tolist()
        return int(self.failures.sum()), [self.samples[i][0] for i in failed]


def check_headers(paths: Sequence[str], short_side: int | None = None) -> list[tuple[str, str]]:
    """`check_image_files` once over all ranks: each DDP rank checks its shard, and all share the result."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return check_image_files(paths, short_side=short_side)
    rank, world = dist.get_rank(), dist.get_world_size()
    cores = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    shards: list[Any] = [None] * world
    dist.all_gather_object(shards, check_image_files(paths[rank::world], num_workers=cores, short_side=short_side))
    return [bad for shard in shards for bad in shard]
