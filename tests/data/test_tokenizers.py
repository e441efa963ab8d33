"""Tokenizers: fixed special ids, word/char/BPE, saved and rebuilt."""

from __future__ import annotations

import pytest

from tests.formats import CORPUS
from vit.data.tokenizers import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    BPETokenizer,
    CharTokenizer,
    WordTokenizer,
    tokenizer_from_dict,
)


def test_special_tokens_have_fixed_ids():
    assert SPECIAL_TOKENS == ("<pad>", "<unk>", "<bos>", "<eos>")
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    texts = [t for _, t in CORPUS]
    for tok in (WordTokenizer.fit(texts), CharTokenizer.fit(texts), BPETokenizer.fit(texts, vocab_size=80)):
        ids = [tok.encode(s)[0] if tok.kind != "bpe" else tok.model.token_to_id(s) for s in SPECIAL_TOKENS]
        if tok.kind == "bpe":
            assert ids == [0, 1, 2, 3]
        assert tok.decode([BOS_ID, *tok.encode("Le chat"), EOS_ID, 9, 9, PAD_ID]) == tok.normalize("Le chat")


def test_word_tokenizer_lowercases_and_maps_unknown_words():
    tok = WordTokenizer.fit(["The cat", "the dog  barks"], lowercase=True)
    assert tok.vocab_size == 4 + 4  # the, cat, dog, barks
    assert tok.tokens[4] == "the"  # most frequent first
    ids = tok.encode("THE   Cat meows")
    assert ids[-1] == UNK_ID and UNK_ID not in ids[:2]
    assert tok.decode(ids) == "the cat <unk>"
    assert WordTokenizer.fit(["a a b"], min_freq=2).tokens == [*SPECIAL_TOKENS, "a"]


def test_char_tokenizer_keeps_spaces_and_round_trips():
    tok = CharTokenizer.fit(["ab ba", "abc"])
    assert tok.vocab_size == 4 + 4  # a, b, c, space
    assert tok.decode(tok.encode("cab ab")) == "cab ab"


def test_tokenizers_round_trip_through_their_saved_dict():
    texts = [s for s, _ in CORPUS]
    for tok in (WordTokenizer.fit(texts, lowercase=True), CharTokenizer.fit(texts),
                BPETokenizer.fit(texts, vocab_size=60, lowercase=True)):
        again = tokenizer_from_dict(tok.to_dict())
        assert type(again) is type(tok) and again.vocab_size == tok.vocab_size
        for text in ("The dog runs.", "Zebras?"):
            assert again.encode(text) == tok.encode(text)
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        tokenizer_from_dict({"kind": "sentencepiece"})


def test_bpe_learns_subwords_and_decodes_training_text():
    texts = ["lower lowest newer newest", "low new wide widest"] * 20
    tok = BPETokenizer.fit(texts, vocab_size=40)
    ids = tok.encode("lowest newest")
    assert len(ids) < len("lowest newest")  # merges happened
    assert tok.decode(ids) == "lowest newest"


def test_decoding_a_perfect_output_gives_the_normalised_reference_and_nfd_input_is_nfc():
    """The reference exact match and BLEU compare with is what decoding spells: French text keeps its no-break
    spaces (Tatoeba writes "Va\u202f!"), and an accent typed as a combining character is the one the vocabulary
    learnt (NFD input once became <unk>, or a bare "caf" with BPE)."""
    import unicodedata

    texts = ["Va\u202f!", "Comment ça va\xa0?", "Bonjour  toi", "Le café est chaud."] * 5
    for tok in (WordTokenizer.fit(texts), CharTokenizer.fit(texts), BPETokenizer.fit(texts, vocab_size=120),
                BPETokenizer.fit(texts, vocab_size=120, lowercase=True)):
        for text in texts[:4]:
            assert tok.decode(tok.encode(text)) == tok.normalize(text), (tok.kind, text)
        nfd = unicodedata.normalize("NFD", "Le café est chaud.")
        assert nfd != "Le café est chaud." and tok.encode(nfd) == tok.encode("Le café est chaud."), tok.kind
        assert UNK_ID not in tok.encode(nfd), tok.kind
