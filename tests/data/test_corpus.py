"""Reading a parallel corpus (`vit.data.corpus`, through TranslationDataModule): malformed lines skipped and named,
aligned files, empty or missing files, invalid UTF-8, a byte-order mark."""

from __future__ import annotations

import codecs
import logging
from pathlib import Path

import pytest

from tests.formats import CORPUS
from vit.data.corpus import Corpus, decode_lines
from vit.data.translation import (
    TranslationDataModule,
)
from vit.errors import UserValueError


def write_tsv(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_tsv_with_malformed_lines_keeps_good_ones_and_reports_bad_line_numbers(tmp_path, caplog):
    lines = [
        "Go.\tVa !\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272",  # 1: Anki's 3rd column
        "no tab on this line",  # 2
        "Hi.\tSalut.",  # 3
        "\tempty source",  # 4
        "Run!\t   ",  # 5
        "",  # 6
        "Who?\tQui ?",  # 7
    ]
    dm = TranslationDataModule(write_tsv(tmp_path / "fra.tsv", lines), val_fraction=0.0, batch_size=2)
    with caplog.at_level(logging.WARNING, logger="vit.data.translation"):
        pairs = dm.pairs["train"]
    assert pairs == [("Go.", "Va !"), ("Hi.", "Salut."), ("Who?", "Qui ?")]
    assert [n for n, _ in dm.malformed["train"]] == [2, 4, 5, 6]
    assert dict(dm.malformed["train"])[4] == "empty source"
    message = caplog.text
    assert "skipped 4 malformed line(s)" in message and "fra.tsv" in message
    for n in (2, 4, 5, 6):
        assert f"line {n} (" in message


def test_aligned_files_and_their_errors(tmp_path):
    src = write_tsv(tmp_path / "train.en", [s for s, _ in CORPUS])
    tgt = write_tsv(tmp_path / "train.fr", [t for _, t in CORPUS])
    dm = TranslationDataModule([src, tgt], val_fraction=0.0)
    assert dm.pairs["train"] == CORPUS
    short = write_tsv(tmp_path / "short.fr", ["Va !"])
    with pytest.raises(ValueError, match="differ in length"):
        _ = TranslationDataModule([src, short]).pairs
    # one file ends with blank lines (an editor's extra newline, `echo >>`): the same pairs, not a mismatch
    padded = tmp_path / "padded.fr"
    padded.write_bytes(Path(tgt).read_bytes() + b"\n \r\n")
    assert TranslationDataModule([src, str(padded)], val_fraction=0.0).pairs["train"] == CORPUS


def test_empty_or_missing_corpus_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.tsv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.tsv holds no usable"):
        _ = TranslationDataModule(str(empty)).pairs
    only_bad = write_tsv(tmp_path / "bad.tsv", ["no tab", "still none"])
    with pytest.raises(ValueError, match="no usable"):
        _ = TranslationDataModule(only_bad).pairs
    with pytest.raises(FileNotFoundError, match=r"missing\.tsv"):
        _ = TranslationDataModule(str(tmp_path / "missing.tsv")).pairs
    with pytest.raises(ValueError, match=r"data\.train"):
        _ = TranslationDataModule().pairs
    with pytest.raises(ValueError, match=r"data\.tokenizer"):
        TranslationDataModule(only_bad, tokenizer="sentencepiece")


def test_invalid_utf8_names_the_line_or_is_skipped_and_counted(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_bytes(b"Go.\tVa !\n" + b"caf\xe9\tcaf\xc3\xa9\n" + b"Hi.\tSalut.\n")
    with pytest.raises(ValueError, match=r"bad\.tsv line 2: not valid UTF-8 \(byte 0xe9 at column 4\).*skip_bad_lines"):
        _ = TranslationDataModule(str(path), val_fraction=0.0).pairs
    dm = TranslationDataModule(str(path), val_fraction=0.0, skip_bad_lines=True)
    assert dm.pairs["train"] == [("Go.", "Va !"), ("Hi.", "Salut.")]
    assert dm.malformed["train"] == [(2, "not valid UTF-8")]


def test_a_tsv_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    """Windows editors save "UTF-8" with a BOM first; it once stayed in the first source ("\ufeffGo.")."""
    path = tmp_path / "bom.tsv"
    path.write_bytes(codecs.BOM_UTF8 + "Go.\tVa !\r\nHi.\u2028there.\tSalut.\r\n".encode())
    dm = TranslationDataModule(str(path), val_fraction=0.0)
    assert dm.pairs["train"] == [("Go.", "Va !"), ("Hi.\u2028there.", "Salut.")]  # U+2028 is text, not a new line


def test_decode_lines_splits_at_line_ends_only_and_drops_the_bom():
    data = codecs.BOM_UTF8 + "a\tb\r\nc\u2028d\re\x0cf\ng".encode()
    assert decode_lines(data, "x.tsv") == ["a\tb", "c\u2028d", "e\x0cf", "g"]


def test_decode_lines_names_a_bad_line_or_skips_it():
    data = b"ok\nbad \xff\nfine"
    with pytest.raises(UserValueError, match=r"x\.tsv line 2: not valid UTF-8 \(byte 0xff at column 5\)"):
        decode_lines(data, "x.tsv")
    assert decode_lines(data, "x.tsv", skip_bad_lines=True) == ["ok", None, "fine"]


def test_corpus_keeps_stripped_pairs_and_names_empty_sides():
    corpus = Corpus()
    corpus.add(1, " hi ", "salut\n")
    corpus.add(2, "  ", "x")
    corpus.add(3, "y", "")
    assert (corpus.pairs, corpus.lines) == ([("hi", "salut")], [1])
    assert corpus.problems == [(2, "empty source"), (3, "empty target")]
