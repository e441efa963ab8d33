"""Tokenizers for the text Transformer: word, character and subword BPE, with fixed special ids.

Every tokenizer reserves the same four ids, defined here once for the model, the data and the tests:
<pad> = 0 (the model's padding id), <unk> = 1, <bos> = 2, <eos> = 3. Tokenizers are built from the
training split only and round-trip through a plain dict, so a checkpoint can carry them.
"""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from vit.errors import UserValueError

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
TOKENIZER_KINDS = ("word", "char", "bpe")


class Tokenizer:
    """Text <-> ids. Subclasses implement ``encode``, ``_decode_tokens`` and ``to_dict``."""

    kind = ""
    # How BLEU splits decoded text (sacrebleu's tokenize): into words. A character vocabulary scores characters.
    bleu_tokenize = "13a"

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

    def piece(self, id: int) -> str:
        """The text piece of one id, special tokens by their names: a label for an attention axis."""
        raise NotImplementedError

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """``piece`` of every id, none dropped (unlike ``decode``)."""
        return [self.piece(int(i)) for i in ids]

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
        return self.prepare(text).split()

    def prepare(self, text: str) -> str:
        """``text`` in NFC (a "é" typed as e + combining accent is the "é" the vocabulary knows), lower-cased
        if asked."""
        text = unicodedata.normalize("NFC", text)
        return text.lower() if self.lowercase else text

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
        return self.join([self.piece(i) for i in ids])

    def piece(self, id: int) -> str:
        return self.tokens[id] if 0 <= id < len(self.tokens) else "<unk>"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "lowercase": self.lowercase, "tokens": self.tokens}


class CharTokenizer(WordTokenizer):
    """One token per character, spaces included."""

    kind = "char"
    # A target is often one "word" here (a name, a transliteration): word 4-gram BLEU would be 0 at any accuracy.
    bleu_tokenize = "char"

    def split(self, text: str) -> list[str]:
        return list(self.prepare(text))

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
        # NFC: a "é" typed as e + combining accent is the "é" the merges know (else it decodes as a bare "e")
        model.normalizer = normalizers.Sequence([normalizers.NFC(), *([normalizers.Lowercase()] if lowercase else [])])
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
        # Metaspace decoding keeps every space as it was (a French "Va\u202f!" too) but a leading one
        return self.model.normalizer.normalize_str(text).strip() if self.model.normalizer else text.strip()

    def _decode_ids(self, ids: list[int]) -> str:
        return self.model.decode(ids)

    def piece(self, id: int) -> str:
        # The subword as stored, with Metaspace's "▁" where a word starts.
        token = self.model.id_to_token(id)
        return "<unk>" if token is None else token

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
    raise UserValueError(f"tokenizer must be one of {TOKENIZER_KINDS}, got {kind!r}")


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


__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "SPECIAL_TOKENS",
    "TOKENIZER_KINDS",
    "UNK_ID",
    "BPETokenizer",
    "CharTokenizer",
    "Tokenizer",
    "WordTokenizer",
    "build_tokenizer",
    "tokenizer_from_dict",
]
