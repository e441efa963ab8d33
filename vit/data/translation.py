"""Parallel text for the Transformer: padded batches of similar length, and the DataModules.

* ``TranslationDataModule`` reads corpora with `vit.data.corpus` (TSV or aligned files); pairs longer
  than ``max_length`` tokens are an error naming the line (or, with ``skip_bad_lines``, left out and
  counted).
* ``SyntheticTranslationDataModule`` serves the seeded toy tasks of `vit.data.synthetic`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler

from vit.data.corpus import Corpus, read_pairs
from vit.data.synthetic import SYNTHETIC_TASKS, Pair, synthetic_pairs
from vit.data.tokenizers import BOS_ID, EOS_ID, PAD_ID, TOKENIZER_KINDS, Tokenizer, build_tokenizer
from vit.errors import UserValueError

log = logging.getLogger(__name__)


# ---- datasets and batches ---------------------------------------------------------------------
Example = tuple[list[int], list[int], str, str]  # source ids, target ids, source text, target text


class PairDataset(Dataset):
    """Encoded pairs: (source ids, target ids, source text, target text)."""

    def __init__(self, examples: list[Example]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> Example:
        return self.examples[i]


def collate_pairs(examples: list[Example]) -> dict[str, Any]:
    """Pad a batch on the right. The decoder reads ``tgt_in`` = <bos> y and predicts ``tgt_out`` = y <eos>."""
    B = len(examples)
    S = max(len(src) for src, *_ in examples)
    T = max(len(tgt) for _, tgt, *_ in examples) + 1
    src = torch.full((B, S), PAD_ID, dtype=torch.long)
    tgt_in = torch.full((B, T), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((B, T), PAD_ID, dtype=torch.long)
    for i, (s, t, _, _) in enumerate(examples):
        src[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        tgt_in[i, : len(t) + 1] = torch.tensor([BOS_ID, *t], dtype=torch.long)
        tgt_out[i, : len(t) + 1] = torch.tensor([*t, EOS_ID], dtype=torch.long)
    return {
        "src": src,  # (B, S)
        "src_padding_mask": src.eq(PAD_ID),  # (B, S), True = padding
        "tgt_in": tgt_in,  # (B, T)
        "tgt_out": tgt_out,  # (B, T)
        "tgt_padding_mask": tgt_out.eq(PAD_ID),  # (B, T)
        "source_text": [e[2] for e in examples],
        "target_text": [e[3] for e in examples],
    }


class EpochSampler(RandomSampler):
    """A random order fixed by ``seed`` and the epoch, so a resumed run draws the uninterrupted run's order.

    Lightning calls ``set_epoch`` at every epoch start. Being a ``RandomSampler`` tells Lightning that
    training shuffles, so under DDP it swaps in a shuffling ``DistributedSampler`` (seeded the same way).
    """

    def __init__(self, data_source: Sized, seed: int = 0) -> None:
        super().__init__(data_source)
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        """Draw the order of this epoch."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(len(self.data_source), generator=g).tolist())


class LengthBucketBatchSampler(BatchSampler):
    """Batches of sentences of similar length, so little of each batch is padding.

    Takes its indices from ``sampler``. Training (``shuffle``): sort within pools of ``pool_batches``
    batches of the sampler's order, then shuffle the batches, by the sampler's seed and epoch.
    Evaluation: sorted by length, in a fixed order. A ``BatchSampler`` with a ``sampler`` argument, so
    under DDP Lightning rebuilds it on a ``DistributedSampler`` and each rank buckets its own share.
    """

    def __init__(
        self, sampler: Sampler[int], batch_size: int, drop_last: bool = False, *, lengths: Sequence[int],
        shuffle: bool, pool_batches: int = 50,
    ) -> None:
        super().__init__(sampler, batch_size, drop_last)
        self.lengths = list(lengths)
        self.shuffle = shuffle
        self.pool_batches = pool_batches

    def __iter__(self) -> Iterator[list[int]]:
        order = list(self.sampler)
        if not self.shuffle:
            order.sort(key=self.lengths.__getitem__)
            batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        else:
            pool = self.batch_size * self.pool_batches
            batches = []
            for start in range(0, len(order), pool):
                chunk = sorted(order[start : start + pool], key=self.lengths.__getitem__)
                batches += [chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
            # the sampler's seed and epoch (ours and DistributedSampler both have them) order the batches
            g = torch.Generator().manual_seed(getattr(self.sampler, "seed", 0) + getattr(self.sampler, "epoch", 0))
            batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        yield from batches


class TranslationDataModule(LightningDataModule):
    """Parallel text from TSV files (``source<TAB>target``) or pairs of aligned files.

    Each split is a TSV path or a ``[source_file, target_file]`` list. Without ``val``,
    ``val_fraction`` of the training pairs is held out. Tokenizers are trained on the
    training split only; ``tokenizers`` holds them as dicts for the model's checkpoint.

    Args:
        train, val, test: the splits' files.
        tokenizer: "word", "char" or "bpe".
        lowercase: lower-case the text before tokenizing.
        min_freq: word/char tokenizers: rarer tokens become <unk>.
        bpe_vocab_size: vocabulary size of the BPE tokenizer.
        share_vocab: one tokenizer for both sides (needed by ``model.share_embeddings``).
        max_length: the most tokens a source, or a target with its <eos>, may have.
        skip_bad_lines: skip and count lines that are not UTF-8 or exceed ``max_length``,
            instead of stopping with an error that names the first of them.
        val_fraction: share of the training pairs held out when there is no ``val``.
        batch_size: sentences per batch.
        num_workers: DataLoader worker processes.
        seed: seed of the held-out split and of the batch order.
    """

    def __init__(
        self,
        train: str | list[str] | None = None,
        val: str | list[str] | None = None,
        test: str | list[str] | None = None,
        *,
        tokenizer: str = "word",
        lowercase: bool = False,
        min_freq: int = 1,
        bpe_vocab_size: int = 8000,
        share_vocab: bool = False,
        max_length: int = 64,
        skip_bad_lines: bool = False,
        val_fraction: float = 0.05,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if tokenizer not in TOKENIZER_KINDS:
            raise UserValueError(f"data.tokenizer must be one of {TOKENIZER_KINDS}, got {tokenizer!r}")
        if max_length < 1:
            raise UserValueError(f"data.max_length must be >= 1, got {max_length}")
        if not 0.0 <= val_fraction < 1.0:
            raise UserValueError(f"data.val_fraction must be in [0, 1), got {val_fraction}")
        self.paths = {"train": train, "val": val, "test": test}
        self.tokenizer_kind = tokenizer
        self.lowercase = lowercase
        self.min_freq = min_freq
        self.bpe_vocab_size = bpe_vocab_size
        self.share_vocab = share_vocab
        self.max_length = max_length
        self.skip_bad_lines = skip_bad_lines
        self.val_fraction = val_fraction
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.malformed: dict[str, list[tuple[int, str]]] = {}  # split -> [(line number, problem)]
        self._corpora: dict[str, Corpus] | None = None
        self._tokenizers: tuple[Tokenizer, Tokenizer] | None = None
        self.datasets: dict[str, PairDataset] = {}

    # -- raw pairs ---------------------------------------------------------------------------
    def load_split(self, split: str) -> Corpus | None:
        """The pairs of one split read from its files, or None when the split has no files."""
        spec = self.paths[split]
        if spec is None:
            if split == "train":
                raise UserValueError("TranslationDataModule needs data.train: a TSV path or [source, target]")
            return None
        corpus = read_pairs(spec, skip_bad_lines=self.skip_bad_lines)
        if corpus.problems:
            problems = corpus.problems
            self.malformed[split] = problems
            shown = ", ".join(f"line {n} ({why})" for n, why in problems[:20])
            more = f" and {len(problems) - 20} more" if len(problems) > 20 else ""
            log.warning("%s: skipped %d malformed line(s) in %s: %s%s", split, len(problems), spec, shown, more)
        if not corpus.pairs:
            raise UserValueError(f"{split} corpus {spec} holds no usable 'source<TAB>target' pair")
        return corpus

    @property
    def corpora(self) -> dict[str, Corpus]:
        """The corpus of each split ("train", "val", and "test" when given), loaded once."""
        if self._corpora is None:
            corpora = {split: self.load_split(split) for split in ("train", "val", "test")}
            train = corpora["train"]
            if corpora["val"] is None and self.val_fraction > 0:
                # Hold out distinct pairs with all their copies: a pair both in val and in train would be scored
                # on what the model was trained on (exports repeat pairs). Without copies, a plain shuffle.
                copies: dict[Pair, list[int]] = {}
                for i, pair in enumerate(train.pairs):
                    copies.setdefault(pair, []).append(i)
                distinct = list(copies.values())
                order = list(range(len(distinct)))
                random.Random(self.seed).shuffle(order)
                n_val = max(1, int(len(order) * self.val_fraction))
                if n_val >= len(order):
                    raise UserValueError(f"only {len(order)} distinct training pair(s): too few to hold out validation")
                pick = lambda groups: Corpus([train.pairs[i] for g in groups for i in distinct[g]],
                                             [train.lines[i] for g in groups for i in distinct[g]])
                corpora["val"], corpora["train"] = pick(order[:n_val]), pick(order[n_val:])
            self._corpora = {k: v for k, v in corpora.items() if v is not None}
        return self._corpora

    @property
    def pairs(self) -> dict[str, list[Pair]]:
        """Text pairs per split."""
        return {split: corpus.pairs for split, corpus in self.corpora.items()}

    # -- tokenizers --------------------------------------------------------------------------
    def _build(self, texts: Iterable[str]) -> Tokenizer:
        return build_tokenizer(
            self.tokenizer_kind, texts, lowercase=self.lowercase, min_freq=self.min_freq,
            bpe_vocab_size=self.bpe_vocab_size,
        )

    @property
    def source_tokenizer(self) -> Tokenizer:
        """Tokenizer of the source side, trained on the training split."""
        return self._get_tokenizers()[0]

    @property
    def target_tokenizer(self) -> Tokenizer:
        """Tokenizer of the target side, trained on the training split."""
        return self._get_tokenizers()[1]

    def _get_tokenizers(self) -> tuple[Tokenizer, Tokenizer]:
        if self._tokenizers is None:
            train = self.pairs["train"]
            if self.share_vocab:
                shared = self._build([t for pair in train for t in pair])
                self._tokenizers = (shared, shared)
            else:
                self._tokenizers = (self._build(s for s, _ in train), self._build(t for _, t in train))
        return self._tokenizers

    @property
    def tokenizers(self) -> dict[str, dict[str, Any]]:
        """Both tokenizers as plain dicts; `vit fit` passes this to ``Translator(tokenizers=...)``."""
        return {"source": self.source_tokenizer.to_dict(), "target": self.target_tokenizer.to_dict()}

    # -- Lightning hooks ---------------------------------------------------------------------
    def _encode(self, split: str, corpus: Corpus) -> PairDataset:
        src_tok, tgt_tok = self._get_tokenizers()
        examples, too_long = [], []
        for (source, target), line in zip(corpus.pairs, corpus.lines):
            s, t = src_tok.encode(source), tgt_tok.encode(target)
            if not s or not t or len(s) > self.max_length or len(t) + 1 > self.max_length:
                too_long.append(f"line {line} ({len(s)} source, {len(t) + 1} target tokens)")
                continue
            examples.append((s, t, source, target))
        if too_long and not self.skip_bad_lines:
            raise UserValueError(
                f"{split} corpus {self.paths[split] or self.paths['train']}: {len(too_long)} pair(s) are empty after "
                f"tokenizing or longer than data.max_length={self.max_length} tokens, first {too_long[0]}; "
                "raise data.max_length, or set data.skip_bad_lines to leave them out"
            )
        if too_long:
            log.warning("%s: left out %d of %d pairs longer than max_length=%d tokens (or empty): %s%s", split,
                        len(too_long), len(corpus.pairs), self.max_length, ", ".join(too_long[:5]),
                        " ..." if len(too_long) > 5 else "")
        if not examples:
            raise UserValueError(f"{split}: no pair fits max_length={self.max_length} tokens; raise data.max_length")
        return PairDataset(examples)

    def setup(self, stage: str | None = None) -> None:
        for split, corpus in self.corpora.items():
            if split not in self.datasets:
                self.datasets[split] = self._encode(split, corpus)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        if split not in self.datasets:
            self.setup()
        if split not in self.datasets:
            raise UserValueError(f"no {split} split: set data.{split} to a TSV path or [source, target] files")
        dataset = self.datasets[split]
        lengths = [len(s) + len(t) for s, t, *_ in dataset.examples]
        order = EpochSampler(dataset, seed=self.seed) if shuffle else SequentialSampler(dataset)
        batches = LengthBucketBatchSampler(order, self.batch_size, lengths=lengths, shuffle=shuffle)
        return DataLoader(
            dataset, batch_sampler=batches, collate_fn=collate_pairs, num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)


class SyntheticTranslationDataModule(TranslationDataModule):
    """Seeded toy translation tasks (copy, reverse, sort, numbers), generated offline.

    Sequences have ``min_len`` to ``max_len`` symbols drawn from ``num_symbols`` (digits for
    "numbers"); validation and test sources never occur in training.
    """

    def __init__(
        self,
        task: str = "reverse",
        *,
        num_train: int = 20000,
        num_val: int = 500,
        num_test: int = 1000,
        min_len: int = 5,
        max_len: int = 15,
        num_symbols: int = 20,
        share_vocab: bool = False,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        if task not in SYNTHETIC_TASKS:
            raise UserValueError(f"data.task must be one of {SYNTHETIC_TASKS}, got {task!r}")
        super().__init__(
            tokenizer="word", share_vocab=share_vocab, max_length=64 if task == "numbers" else max_len + 1,
            batch_size=batch_size, num_workers=num_workers, seed=seed,
        )
        self.task = task
        self.sizes = {"train": num_train, "val": num_val, "test": num_test}
        self.lengths = dict(min_len=min_len, max_len=max_len, num_symbols=num_symbols)
        synthetic_pairs(task, 1, **self.lengths)  # fail on bad lengths now, not at fit time

    def load_split(self, split: str) -> Corpus | None:
        if self.sizes["train"] <= 0:
            raise UserValueError(f"data.num_train must be positive, got {self.sizes['train']}")
        # Each split excludes the sources of the splits before it: train, then val, then test.
        seen: set[str] = set()
        for name, offset in (("train", 0), ("val", 1), ("test", 2)):
            pairs = synthetic_pairs(
                self.task, self.sizes[name], seed=self.seed * 3 + offset, exclude=seen or None, **self.lengths
            )
            if name == split:
                return Corpus(pairs, list(range(1, len(pairs) + 1))) if pairs else None
            seen |= {source for source, _ in pairs}
        raise UserValueError(f"unknown split {split!r}")


__all__ = ["EpochSampler", "LengthBucketBatchSampler", "PairDataset", "SyntheticTranslationDataModule",
           "TranslationDataModule", "collate_pairs"]
