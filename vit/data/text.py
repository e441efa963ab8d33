"""Parallel text for the Transformer: tokenizers, corpus reading, length-bucketed batches.

* Tokenizers: word-level (whitespace), character-level, and subword BPE through the
  `tokenizers` package. All share the special ids below (pad = 0), are built from the
  training split only, and round-trip through a plain dict so a checkpoint can carry them.
* ``TranslationDataModule`` reads ``source<TAB>target`` lines (the Tatoeba/Anki export) or two
  aligned files, reports malformed lines by number, filters long pairs and batches
  sentences of similar length together.
* ``SyntheticTranslationDataModule`` generates seeded toy tasks (copy, reverse, sort,
  numbers to words) to check and demonstrate the model offline.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from vit.nn.text import PAD_ID

log = logging.getLogger(__name__)

# Fixed ids: <pad> = 0 (the model's padding id), then <unk>, <bos>, <eos>.
SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
UNK_ID, BOS_ID, EOS_ID = 1, 2, 3
TOKENIZER_KINDS = ("word", "char", "bpe")
SYNTHETIC_TASKS = ("copy", "reverse", "sort", "numbers")

Pair = tuple[str, str]


# ---- tokenizers ------------------------------------------------------------------------------
class Tokenizer:
    """Text <-> ids. Subclasses implement ``encode``, ``_decode_tokens`` and ``to_dict``."""

    kind = ""

    @property
    def vocab_size(self) -> int:
        """Number of ids, the four special tokens included."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, without BOS/EOS."""
        raise NotImplementedError

    def normalize(self, text: str) -> str:
        """``text`` as decoding would spell it (case, spacing): the reference for BLEU and exact match."""
        return text

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``: stops at EOS, drops PAD and BOS."""
        kept = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                kept.append(i)
        return self._decode_ids(kept)

    def _decode_ids(self, ids: list[int]) -> str:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """A JSON/YAML-friendly description from which ``tokenizer_from_dict`` rebuilds it."""
        raise NotImplementedError


class WordTokenizer(Tokenizer):
    """Whitespace-separated words, optionally lower-cased; unknown words map to <unk>."""

    kind = "word"

    def __init__(self, tokens: Sequence[str], *, lowercase: bool = False) -> None:
        if tuple(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"a vocabulary must start with {SPECIAL_TOKENS}, got {list(tokens[:4])}")
        self.tokens = list(tokens)
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self.lowercase = lowercase

    @classmethod
    def fit(cls, texts: Iterable[str], *, lowercase: bool = False, min_freq: int = 1) -> WordTokenizer:
        """Build the vocabulary from training texts (most frequent first, ties alphabetical)."""
        tok = cls(SPECIAL_TOKENS, lowercase=lowercase)
        counts = Counter(piece for text in texts for piece in tok.split(text))
        ranked = sorted((c for c in counts.items() if c[1] >= min_freq), key=lambda c: (-c[1], c[0]))
        return cls(list(SPECIAL_TOKENS) + [t for t, _ in ranked if t not in SPECIAL_TOKENS],
                   lowercase=lowercase)

    def split(self, text: str) -> list[str]:
        """The pieces of ``text`` before they become ids."""
        return (text.lower() if self.lowercase else text).split()

    def join(self, pieces: list[str]) -> str:
        return " ".join(pieces)

    def normalize(self, text: str) -> str:
        return self.join(self.split(text))

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        return [self.index.get(piece, UNK_ID) for piece in self.split(text)]

    def _decode_ids(self, ids: list[int]) -> str:
        return self.join([self.tokens[i] if i < len(self.tokens) else "<unk>" for i in ids])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "lowercase": self.lowercase, "tokens": self.tokens}


class CharTokenizer(WordTokenizer):
    """One token per character, spaces included."""

    kind = "char"

    def split(self, text: str) -> list[str]:
        return list(text.lower() if self.lowercase else text)

    def join(self, pieces: list[str]) -> str:
        return "".join(pieces)


class BPETokenizer(Tokenizer):
    """Subword byte-pair encoding, trained and run by the `tokenizers` package."""

    kind = "bpe"

    def __init__(self, model: Any, *, lowercase: bool = False) -> None:
        self.model = model  # a tokenizers.Tokenizer
        self.lowercase = lowercase

    @classmethod
    def fit(cls, texts: Iterable[str], *, vocab_size: int = 8000, lowercase: bool = False) -> BPETokenizer:
        """Learn merges on training texts; the special tokens get ids 0-3."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

        model = HFTokenizer(models.BPE(unk_token="<unk>"))
        if lowercase:
            model.normalizer = normalizers.Lowercase()
        # Metaspace marks word starts with "▁", so decoding restores the spaces.
        model.pre_tokenizer = pre_tokenizers.Metaspace()
        model.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
        )
        model.train_from_iterator(texts, trainer)
        return cls(model, lowercase=lowercase)

    @property
    def vocab_size(self) -> int:
        return self.model.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.model.encode(text, add_special_tokens=False).ids

    def normalize(self, text: str) -> str:
        return " ".join((text.lower() if self.lowercase else text).split())

    def _decode_ids(self, ids: list[int]) -> str:
        return self.model.decode(ids)

    def to_dict(self) -> dict[str, Any]:
        # The tokenizers package's JSON, as a nested dict: config parsers leave nested values alone.
        return {"kind": self.kind, "lowercase": self.lowercase, "tokenizer": json.loads(self.model.to_str())}


def build_tokenizer(
    kind: str, texts: Iterable[str], *, lowercase: bool = False, min_freq: int = 1,
    bpe_vocab_size: int = 8000,
) -> Tokenizer:
    """Train a tokenizer of ``kind`` ("word", "char" or "bpe") on training texts."""
    if kind == "word":
        return WordTokenizer.fit(texts, lowercase=lowercase, min_freq=min_freq)
    if kind == "char":
        return CharTokenizer.fit(texts, lowercase=lowercase, min_freq=min_freq)
    if kind == "bpe":
        return BPETokenizer.fit(texts, vocab_size=bpe_vocab_size, lowercase=lowercase)
    raise ValueError(f"tokenizer must be one of {TOKENIZER_KINDS}, got {kind!r}")


def tokenizer_from_dict(state: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer saved with ``Tokenizer.to_dict`` (e.g. from a checkpoint)."""
    kind = state.get("kind")
    if kind in ("word", "char"):
        cls = WordTokenizer if kind == "word" else CharTokenizer
        return cls(state["tokens"], lowercase=bool(state.get("lowercase", False)))
    if kind == "bpe":
        from tokenizers import Tokenizer as HFTokenizer

        model = HFTokenizer.from_str(json.dumps(state["tokenizer"]))
        return BPETokenizer(model, lowercase=bool(state.get("lowercase")))
    raise ValueError(f"unknown tokenizer kind {kind!r} in saved state; expected one of {TOKENIZER_KINDS}")


# ---- reading parallel text --------------------------------------------------------------------
def _open_lines(path: str | Path) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"parallel corpus {str(path)!r} not found. Expected a UTF-8 text file, e.g. an Anki/Tatoeba "
            "export (https://www.manythings.org/anki/) with one 'source<TAB>target' pair per line."
        )
    return path.read_text(encoding="utf-8").splitlines()


def read_tsv_pairs(path: str | Path) -> tuple[list[Pair], list[tuple[int, str]]]:
    """Read ``source<TAB>target[<TAB>anything]`` lines. Returns (pairs, [(line number, problem)])."""
    pairs, problems = [], []
    for number, line in enumerate(_open_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) < 2:
            problems.append((number, "no tab between source and target"))
            continue
        source, target = fields[0].strip(), fields[1].strip()
        if not source or not target:
            problems.append((number, "empty source" if not source else "empty target"))
            continue
        pairs.append((source, target))
    return pairs, problems


def read_aligned_pairs(
    source_path: str | Path, target_path: str | Path
) -> tuple[list[Pair], list[tuple[int, str]]]:
    """Read two files whose line i are translations of each other."""
    sources, targets = _open_lines(source_path), _open_lines(target_path)
    if len(sources) != len(targets):
        raise ValueError(
            f"aligned files differ in length: {source_path} has {len(sources)} lines, "
            f"{target_path} has {len(targets)}"
        )
    pairs, problems = [], []
    for number, (source, target) in enumerate(zip(sources, targets), start=1):
        source, target = source.strip(), target.strip()
        if not source or not target:
            problems.append((number, "empty source" if not source else "empty target"))
            continue
        pairs.append((source, target))
    return pairs, problems


def read_pairs(spec: str | Sequence[str]) -> tuple[list[Pair], list[tuple[int, str]]]:
    """A TSV path, or a [source file, target file] pair of aligned files."""
    if isinstance(spec, (str, Path)):
        return read_tsv_pairs(spec)
    if len(spec) == 2:
        return read_aligned_pairs(spec[0], spec[1])
    raise ValueError(f"a split is a TSV path or [source_file, target_file], got {spec!r}")


# ---- synthetic tasks --------------------------------------------------------------------------
_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
)
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = ("", "thousand", "million", "billion", "trillion")


def number_to_words(n: int) -> str:
    """English words for 0 <= n < 10**15, e.g. 307 -> 'three hundred seven'."""
    if not 0 <= n < 10**15:
        raise ValueError(f"number_to_words handles 0 <= n < 10**15, got {n}")
    if n == 0:
        return "zero"
    words: list[str] = []
    for scale in range(len(_SCALES) - 1, -1, -1):
        group = n // 1000**scale % 1000
        if not group:
            continue
        hundreds, rest = divmod(group, 100)
        if hundreds:
            words += [_ONES[hundreds], "hundred"]
        if rest >= 20:
            words.append(_TENS[rest // 10])
            if rest % 10:
                words.append(_ONES[rest % 10])
        elif rest:
            words.append(_ONES[rest])
        if _SCALES[scale]:
            words.append(_SCALES[scale])
    return " ".join(words)


def _synthetic_pair(task: str, rng: random.Random, min_len: int, max_len: int, num_symbols: int) -> Pair:
    length = rng.randint(min_len, max_len)
    if task == "numbers":
        digits = [rng.randint(1 if length > 1 else 0, 9)] + [rng.randint(0, 9) for _ in range(length - 1)]
        return " ".join(map(str, digits)), number_to_words(int("".join(map(str, digits))))
    seq = [rng.randrange(num_symbols) for _ in range(length)]
    target = {"copy": seq, "reverse": seq[::-1], "sort": sorted(seq)}[task]
    return " ".join(map(str, seq)), " ".join(map(str, target))


def synthetic_pairs(
    task: str,
    num_pairs: int,
    *,
    min_len: int = 5,
    max_len: int = 15,
    num_symbols: int = 20,
    seed: int = 0,
    exclude: set[str] | None = None,
) -> list[Pair]:
    """Seeded toy pairs. Sources are symbols ``0 .. num_symbols-1`` (digits for "numbers").

    copy: ``4 1 7 -> 4 1 7``; reverse: ``4 1 7 -> 7 1 4``; sort: ``4 1 7 -> 1 4 7``;
    numbers: ``3 0 7 -> three hundred seven``. Sources in ``exclude`` are never produced,
    which keeps held-out splits disjoint from training.
    """
    if task not in SYNTHETIC_TASKS:
        raise ValueError(f"task must be one of {SYNTHETIC_TASKS}, got {task!r}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    if task == "numbers" and max_len > 15:
        raise ValueError(f"the numbers task spells numbers below 10**15: need max_len <= 15, got {max_len}")
    if task != "numbers" and num_symbols < 2:
        raise ValueError(f"num_symbols must be >= 2, got {num_symbols}")
    rng = random.Random(f"{task}-{seed}")
    pairs: list[Pair] = []
    attempts = 0
    while len(pairs) < num_pairs:
        attempts += 1
        if attempts > 100 * num_pairs + 1000:
            raise ValueError(
                f"could not draw {num_pairs} {task!r} pairs outside the excluded sources; "
                "the space of sequences is too small: widen min_len/max_len or num_symbols"
            )
        pair = _synthetic_pair(task, rng, min_len, max_len, num_symbols)
        if exclude is None or pair[0] not in exclude:
            pairs.append(pair)
    return pairs


# ---- datasets and batches ---------------------------------------------------------------------
class PairDataset(Dataset):
    """Encoded pairs: (source ids, target ids, source text, target text)."""

    def __init__(self, examples: list[tuple[list[int], list[int], str, str]]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> tuple[list[int], list[int], str, str]:
        return self.examples[i]


def collate_pairs(examples: list[tuple[list[int], list[int], str, str]]) -> dict[str, Any]:
    """Pad a batch. The decoder reads ``tgt_in`` = <bos> y and predicts ``tgt_out`` = y <eos>."""
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


class LengthBucketBatchSampler(Sampler[list[int]]):
    """Batches of sentences of similar length, so little of each batch is padding.

    Training: shuffle, sort within pools of ``pool_batches`` batches, shuffle the batches
    (a new order every epoch). Evaluation: sort everything by length, keep the order fixed.
    """

    def __init__(
        self, lengths: Sequence[int], batch_size: int, *, shuffle: bool, seed: int = 0, pool_batches: int = 50
    ) -> None:
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.pool_batches = pool_batches
        self.epoch = 0

    def __len__(self) -> int:
        return (len(self.lengths) + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        if not self.shuffle:
            order = sorted(range(len(self.lengths)), key=self.lengths.__getitem__)
            yield from (order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size))
            return
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        self.epoch += 1
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        pool = self.batch_size * self.pool_batches
        batches = []
        for start in range(0, len(order), pool):
            chunk = sorted(order[start : start + pool], key=self.lengths.__getitem__)
            batches += [chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        for i in torch.randperm(len(batches), generator=g).tolist():
            yield batches[i]


class TranslationDataModule(L.LightningDataModule):
    """Parallel text from TSV files (``source<TAB>target``) or pairs of aligned files.

    Each split is a TSV path or a ``[source_file, target_file]`` list. Without ``val``,
    ``val_fraction`` of the training pairs is held out. Tokenizers are trained on the
    training split only; ``tokenizers`` holds them as dicts for the model's checkpoint.
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
        val_fraction: float = 0.05,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if tokenizer not in TOKENIZER_KINDS:
            raise ValueError(f"data.tokenizer must be one of {TOKENIZER_KINDS}, got {tokenizer!r}")
        if max_length < 1:
            raise ValueError(f"data.max_length must be >= 1, got {max_length}")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in [0, 1), got {val_fraction}")
        self.paths = {"train": train, "val": val, "test": test}
        self.tokenizer_kind = tokenizer
        self.lowercase = lowercase
        self.min_freq = min_freq
        self.bpe_vocab_size = bpe_vocab_size
        self.share_vocab = share_vocab
        self.max_length = max_length
        self.val_fraction = val_fraction
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.malformed: dict[str, list[tuple[int, str]]] = {}  # split -> [(line number, problem)]
        self._pairs: dict[str, list[Pair]] | None = None
        self._tokenizers: tuple[Tokenizer, Tokenizer] | None = None
        self.datasets: dict[str, PairDataset] = {}

    # -- raw pairs ---------------------------------------------------------------------------
    def load_split(self, split: str) -> list[Pair] | None:
        """Pairs of one split read from its files, or None when the split has no files."""
        spec = self.paths[split]
        if spec is None:
            if split == "train":
                raise ValueError("TranslationDataModule needs data.train: a TSV path or [source, target]")
            return None
        pairs, problems = read_pairs(spec)
        if problems:
            self.malformed[split] = problems
            shown = ", ".join(f"line {n} ({why})" for n, why in problems[:20])
            more = f" and {len(problems) - 20} more" if len(problems) > 20 else ""
            log.warning("%s: skipped %d malformed line(s) in %s: %s%s",
                        split, len(problems), spec, shown, more)
        if not pairs:
            raise ValueError(f"{split} corpus {spec} holds no usable 'source<TAB>target' pair")
        return pairs

    @property
    def pairs(self) -> dict[str, list[Pair]]:
        """Text pairs per split ("train", "val", and "test" when given), loaded once."""
        if self._pairs is None:
            pairs = {split: self.load_split(split) for split in ("train", "val", "test")}
            if pairs["val"] is None and self.val_fraction > 0:
                shuffled = pairs["train"][:]
                random.Random(self.seed).shuffle(shuffled)
                n_val = max(1, int(len(shuffled) * self.val_fraction))
                if n_val >= len(shuffled):
                    raise ValueError(f"only {len(shuffled)} training pair(s): too few to hold out validation")
                pairs["val"], pairs["train"] = shuffled[:n_val], shuffled[n_val:]
            self._pairs = {k: v for k, v in pairs.items() if v is not None}
        return self._pairs

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
    def setup(self, stage: str | None = None) -> None:
        src_tok, tgt_tok = self._get_tokenizers()
        for split, pairs in self.pairs.items():
            if split in self.datasets:
                continue
            examples, too_long = [], 0
            for source, target in pairs:
                s, t = src_tok.encode(source), tgt_tok.encode(target)
                if not s or not t or len(s) > self.max_length or len(t) + 1 > self.max_length:
                    too_long += 1
                    continue
                examples.append((s, t, source, target))
            if too_long:
                log.info("%s: left out %d of %d pairs longer than max_length=%d tokens (or empty after "
                         "tokenizing)", split, too_long, len(pairs), self.max_length)
            if not examples:
                raise ValueError(
                    f"{split}: no pair fits max_length={self.max_length} tokens; raise data.max_length"
                )
            self.datasets[split] = PairDataset(examples)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        if split not in self.datasets:
            self.setup()
        if split not in self.datasets:
            raise ValueError(f"no {split} split: set data.{split} to a TSV path or [source, target] files")
        dataset = self.datasets[split]
        lengths = [len(s) + len(t) for s, t, *_ in dataset.examples]
        sampler = LengthBucketBatchSampler(lengths, self.batch_size, shuffle=shuffle, seed=self.seed)
        return DataLoader(
            dataset, batch_sampler=sampler, collate_fn=collate_pairs, num_workers=self.num_workers,
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
            raise ValueError(f"data.task must be one of {SYNTHETIC_TASKS}, got {task!r}")
        super().__init__(
            tokenizer="word", share_vocab=share_vocab, max_length=64 if task == "numbers" else max_len + 1,
            batch_size=batch_size, num_workers=num_workers, seed=seed,
        )
        self.task = task
        self.sizes = {"train": num_train, "val": num_val, "test": num_test}
        self.lengths = dict(min_len=min_len, max_len=max_len, num_symbols=num_symbols)
        synthetic_pairs(task, 1, **self.lengths)  # fail on bad lengths now, not at fit time

    def load_split(self, split: str) -> list[Pair] | None:
        if self.sizes["train"] <= 0:
            raise ValueError(f"data.num_train must be positive, got {self.sizes['train']}")
        # Each split excludes the sources of the splits before it: train, then val, then test.
        seen: set[str] = set()
        for name, offset in (("train", 0), ("val", 1), ("test", 2)):
            pairs = synthetic_pairs(
                self.task, self.sizes[name], seed=self.seed * 3 + offset, exclude=seen or None, **self.lengths
            )
            if name == split:
                return pairs or None
            seen |= {source for source, _ in pairs}
        raise ValueError(f"unknown split {split!r}")


__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "SPECIAL_TOKENS",
    "SYNTHETIC_TASKS",
    "UNK_ID",
    "BPETokenizer",
    "CharTokenizer",
    "LengthBucketBatchSampler",
    "SyntheticTranslationDataModule",
    "Tokenizer",
    "TranslationDataModule",
    "WordTokenizer",
    "build_tokenizer",
    "collate_pairs",
    "number_to_words",
    "read_aligned_pairs",
    "read_pairs",
    "read_tsv_pairs",
    "synthetic_pairs",
    "tokenizer_from_dict",
]
