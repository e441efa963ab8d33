"""Image-caption pairs for contrastive training (`vit.tasks.ContrastiveTask`): a table ``path,caption``.

    captions.csv ─► read_captions ─► [(image path, caption)] ─► group_captions ─► [(image path, [captions])]
                 ─► CaptionPairs ─► (image (C, H, W), one of its captions)
    captions (T)  ─► CharCaptions (a tiny CLIP's own text side) ─► ids (T, L): <bos> chars <eot> <pad>...
                     (`CharCaptions.words`: whole words of the training captions instead of characters)

A deliberately small reader: a CSV with a header that names ``path`` and ``caption`` (paths relative to the
table's folder), images resized to a square and normalised, no augmentation. An image may have several captions
(as COCO's five): several rows with the same path. Training then sees one of them per visit, drawn anew each
epoch from the seed, the epoch and the image (`CaptionSampler`), so a run and its resumption draw the same;
validation always takes the image's first caption. The labels-file DataModule of
issue 51 (`vit/data/table.py`, being written beside this) is the general reader; this one serves the
contrastive task until it lands.
"""

from __future__ import annotations

import csv
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from vit.data.io import load_image
from vit.data.tokenizers import (
    BOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    CharTokenizer,
    Tokenizer,
    WordTokenizer,
    tokenizer_from_dict,
)
from vit.errors import UserPathError, UserValueError

# What a tiny CLIP trained from scratch reads: lower-case letters, digits, spaces and simple punctuation.
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 .,'-"


def read_captions(path: str | os.PathLike) -> list[tuple[Path, str]]:
    """The (image path, caption) rows of a CSV table with ``path`` and ``caption`` columns; a relative path is
    relative to the table's folder. A missing column, an empty caption or a missing image names its row."""
    path = Path(path)
    if not path.is_file():
        raise UserPathError(f"caption table not found: {path} (a CSV with a header: path,caption)")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        if "path" not in columns or "caption" not in columns:
            raise UserValueError(f"{path}: the header must name the columns path and caption, found "
                                 f"{','.join(columns) or 'no header'}")
        rows = []
        for line, row in enumerate(reader, start=2):
            image, caption = (row.get("path") or "").strip(), (row.get("caption") or "").strip()
            if not image or not caption:
                raise UserValueError(f"{path}, line {line}: an empty {'path' if not image else 'caption'}")
            full = Path(image) if Path(image).is_absolute() else path.parent / image
            if not full.is_file():
                raise UserPathError(f"{path}, line {line}: image not found: {full}")
            rows.append((full, caption))
    if not rows:
        raise UserValueError(f"{path}: no rows under the header")
    return rows


def group_captions(rows: Sequence[tuple[Path, str]]) -> list[tuple[Path, list[str]]]:
    """The rows of one image (the same path) as one entry with its captions in table order, images in the order
    of their first row."""
    groups: dict[Path, list[str]] = {}
    for path, caption in rows:
        groups.setdefault(path, []).append(caption)
    return list(groups.items())


class CaptionPairs(Dataset):
    """(image, caption) pairs: the image resized to ``img_size`` square, as floats normalised by mean/std.

    ``images`` holds each image once with its captions (`group_captions`). With ``draw`` an index
    ``epoch * len(self) + i`` (what `CaptionSampler` yields) gives image ``i`` with a caption drawn from
    (``seed``, epoch, i): the same in any worker and on a resumed run. Without ``draw``, the first caption."""

    def __init__(self, images: Sequence[tuple[Path, Sequence[str]]], img_size: int, in_chans: int,
                 mean: Sequence[float], std: Sequence[float], draw: bool = False, seed: int = 0) -> None:
        self.images = [(path, list(captions)) for path, captions in images]
        self.draw, self.seed = draw, seed
        self.img_size, self.mode = img_size, "L" if in_chans == 1 else "RGB"
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.images)

    def caption(self, index: int) -> str:
        """The caption an index reads (the epoch is ``index // len(self)``)."""
        epoch, image = divmod(index, len(self))
        captions = self.images[image][1]
        if not self.draw or len(captions) == 1:
            return captions[0]
        # a str seed is hashed with SHA-512: the same draw in every process, whatever PYTHONHASHSEED
        return captions[random.Random(f"{self.seed}:{epoch}:{image}").randrange(len(captions))]

    def __getitem__(self, index: int) -> tuple[Tensor, str]:
        path = self.images[index % len(self)][0]
        image = load_image(path, self.mode).resize((self.img_size, self.img_size), Image.Resampling.BICUBIC)
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0)
        pixels = pixels.unsqueeze(0) if pixels.ndim == 2 else pixels.permute(2, 0, 1)  # (C, H, W)
        return (pixels - self.mean) / self.std, self.caption(index)


class CaptionSampler(Sampler[int]):
    """A random order of ``size`` images fixed by ``seed`` and the epoch, each index carrying the epoch
    (``epoch * size + i``) for `CaptionPairs`' caption draw. Lightning calls ``set_epoch`` at every epoch start
    (under DDP through the wrapper that shards a custom sampler's indices), so the draw needs no state in the
    dataset: a worker's copy and a resumed run read the epoch from the index."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        order = random.Random(f"order:{self.seed}:{self.epoch}").sample(range(self.size), self.size)
        return iter([self.epoch * self.size + i for i in order])


class CaptionTable(pl.LightningDataModule):
    """Image-caption pairs from CSV tables (``path,caption``) for `vit.tasks.ContrastiveTask`.

    Args:
        train: the training table. val: the validation table; None holds out ``val_fraction`` of train (seeded).
        img_size, in_chans, mean, std: how the images reach the model (square, 1 or 3 channels, normalised).
    """

    def __init__(self, train: str, val: str | None = None, val_fraction: float = 0.1, img_size: int = 224,
                 in_chans: int = 3, mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 batch_size: int = 64, num_workers: int = 0, seed: int = 0) -> None:
        super().__init__()
        if in_chans not in (1, 3):
            raise UserValueError(f"in_chans must be 1 (grey) or 3 (RGB), got {in_chans}")
        if val is None and not 0.0 < val_fraction < 1.0:
            raise UserValueError(f"val_fraction must lie in (0, 1) without a val table, got {val_fraction}")
        self.hp = SimpleNamespace(train=train, val=val, val_fraction=val_fraction, batch_size=batch_size,
                                  num_workers=num_workers, seed=seed)
        self.img_size, self.in_chans = img_size, in_chans  # `vit fit` links them to the task's
        self.mean = list(mean) if mean is not None else [0.5] * in_chans
        self.std = list(std) if std is not None else [0.5] * in_chans
        self.splits: dict[str, CaptionPairs] = {}

    def setup(self, stage: str | None = None) -> None:
        hp = self.hp
        train = group_captions(read_captions(hp.train))
        if hp.val is not None:
            val = group_captions(read_captions(hp.val))
        else:
            order = torch.randperm(len(train), generator=torch.Generator().manual_seed(hp.seed)).tolist()
            held = max(1, round(hp.val_fraction * len(train)))
            val, train = [train[i] for i in order[:held]], [train[i] for i in order[held:]]
        make = lambda images, draw: CaptionPairs(images, self.img_size, self.in_chans, self.mean, self.std, draw,
                                                 hp.seed)
        self.splits = {"train": make(train, True), "val": make(val, False)}

    def captions(self, split: str = "train") -> list[str]:
        """Every caption of a split (after ``setup``)."""
        return [caption for _, captions in self.splits[split].images for caption in captions]

    def train_dataloader(self) -> DataLoader:
        train = self.splits["train"]
        return DataLoader(train, batch_size=self.hp.batch_size, sampler=CaptionSampler(len(train), self.hp.seed),
                          num_workers=self.hp.num_workers, drop_last=len(train) > self.hp.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["val"], batch_size=self.hp.batch_size, num_workers=self.hp.num_workers)


class CharCaptions:
    """Captions as a text tower built from scratch reads them: one id per character of a fixed alphabet (so the
    vocabulary is known before any data is read), ``<bos>`` first, then an end-of-text id that is the highest
    of all (CLIP's tower pools at the highest id), then ``<pad>`` up to ``context_length``. Longer captions are
    cut, keeping the end-of-text."""

    def __init__(self, alphabet: str = ALPHABET, context_length: int = 32, lowercase: bool = True) -> None:
        if context_length < 3:
            raise UserValueError(f"context_length must leave room for <bos>, a character and <eot>, got "
                                 f"{context_length}")
        self.context_length = context_length
        self.tokenizer: Tokenizer = CharTokenizer([*SPECIAL_TOKENS, *dict.fromkeys(alphabet)], lowercase=lowercase)

    @property
    def vocab_size(self) -> int:
        """Ids the tower's embedding needs: the tokenizer's and the end-of-text."""
        return self.tokenizer.vocab_size + 1

    @property
    def eot_id(self) -> int:
        """The end-of-text id: the highest."""
        return self.tokenizer.vocab_size

    def __call__(self, texts: str | Sequence[str]) -> Tensor:
        """Ids (T, context_length) of ``texts``."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        ids = torch.full((len(texts), self.context_length), PAD_ID, dtype=torch.long)
        for row, text in enumerate(texts):
            body = self.tokenizer.encode(text)[: self.context_length - 2]
            ids[row, : len(body) + 2] = torch.tensor([BOS_ID, *body, self.eot_id])
        return ids

    @classmethod
    def words(cls, texts: Iterable[str], context_length: int = 32) -> CharCaptions:
        """Whole lower-cased words instead of characters, the vocabulary those of ``texts`` (the training
        captions): a word they lack reads as <unk>. The ids are laid out as for characters."""
        made = cls(context_length=context_length)
        made.tokenizer = WordTokenizer.fit(texts, lowercase=True)
        return made

    def to_dict(self) -> dict[str, Any]:
        """What `CharCaptions.from_dict` rebuilds it from (a checkpoint's)."""
        return {"tokenizer": self.tokenizer.to_dict(), "context_length": self.context_length}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> CharCaptions:
        """The tokenizer `to_dict` described."""
        made = cls(context_length=int(state["context_length"]))
        made.tokenizer = tokenizer_from_dict(state["tokenizer"])
        return made


__all__ = ["ALPHABET", "CaptionPairs", "CaptionSampler", "CaptionTable", "CharCaptions", "group_captions",
           "read_captions"]
