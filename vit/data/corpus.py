"""Reading parallel text: ``source<TAB>target`` lines (the Tatoeba/Anki export) or two aligned files.

Lines without a tab or with an empty side are left out and reported by number; a line that is not
UTF-8 is an error naming it (or, with ``skip_bad_lines``, left out and counted).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vit.data.synthetic import Pair
from vit.errors import UserPathError, UserValueError


@dataclass
class Corpus:
    """Pairs read from a file, the line each came from, and the lines left out with the reason."""

    pairs: list[Pair] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    problems: list[tuple[int, str]] = field(default_factory=list)

    def add(self, number: int, source: str, target: str) -> None:
        source, target = source.strip(), target.strip()
        if not source or not target:
            self.problems.append((number, "empty source" if not source else "empty target"))
        else:
            self.pairs.append((source, target))
            self.lines.append(number)


def read_lines(path: str | Path, *, skip_bad_lines: bool = False) -> list[str | None]:
    """A UTF-8 file's lines; a line that is not UTF-8 is an error naming it, or None with ``skip_bad_lines``."""
    path = Path(path)
    if not path.is_file():
        raise UserPathError(
            f"parallel corpus {str(path)!r} not found. Expected a UTF-8 text file, e.g. an Anki/Tatoeba "
            "export (https://www.manythings.org/anki/) with one 'source<TAB>target' pair per line."
        )
    return decode_lines(path.read_bytes(), str(path), skip_bad_lines=skip_bad_lines)


def decode_lines(data: bytes, name: str, *, skip_bad_lines: bool = False,
                 fix: str = "re-encode the file, or set data.skip_bad_lines to skip it") -> list[str | None]:
    """The lines of UTF-8 ``data``, split at \\n, \\r\\n or \\r only (U+2028 and form feeds are text), without the
    byte-order mark Windows editors write first. A line that is not UTF-8 is an error naming ``name``, the line
    and the ``fix``, or None with ``skip_bad_lines``."""
    lines: list[str | None] = []
    for number, raw in enumerate(data.removeprefix(codecs.BOM_UTF8).splitlines(), start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            if not skip_bad_lines:
                raise UserValueError(f"{name} line {number}: not valid UTF-8 (byte {raw[e.start]:#04x} at column "
                                     f"{e.start + 1}); {fix}") from None
            lines.append(None)
    return lines


def read_tsv_pairs(path: str | Path, *, skip_bad_lines: bool = False) -> Corpus:
    """Read ``source<TAB>target[<TAB>anything]`` lines."""
    corpus = Corpus()
    lines = read_lines(path, skip_bad_lines=skip_bad_lines)
    for number, line in enumerate(lines, start=1):
        if line is None:
            corpus.problems.append((number, "not valid UTF-8"))
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            corpus.problems.append((number, "no tab between source and target"))
            continue
        corpus.add(number, fields[0], fields[1])
    return corpus


def read_aligned_pairs(source_path: str | Path, target_path: str | Path, *, skip_bad_lines: bool = False) -> Corpus:
    """Read two files whose line i are translations of each other."""
    # Blank lines at the end are no pairs: an editor's or `echo >>`'s extra newline must not misalign the files.
    sources = _without_trailing_blanks(read_lines(source_path, skip_bad_lines=skip_bad_lines))
    targets = _without_trailing_blanks(read_lines(target_path, skip_bad_lines=skip_bad_lines))
    if len(sources) != len(targets):
        raise UserValueError(
            f"aligned files differ in length: {source_path} has {len(sources)} lines, "
            f"{target_path} has {len(targets)}"
        )
    corpus = Corpus()
    for number, (source, target) in enumerate(zip(sources, targets), start=1):
        if source is None or target is None:
            corpus.problems.append((number, "not valid UTF-8"))
        else:
            corpus.add(number, source, target)
    return corpus


def _without_trailing_blanks(lines: list[str | None]) -> list[str | None]:
    end = len(lines)
    while end and lines[end - 1] is not None and not lines[end - 1].strip():
        end -= 1
    return lines[:end]


def read_pairs(spec: str | Sequence[str], *, skip_bad_lines: bool = False) -> Corpus:
    """A TSV path, or a [source file, target file] pair of aligned files."""
    if isinstance(spec, (str, Path)):
        return read_tsv_pairs(spec, skip_bad_lines=skip_bad_lines)
    if len(spec) == 2:
        return read_aligned_pairs(spec[0], spec[1], skip_bad_lines=skip_bad_lines)
    raise UserValueError(f"a split is a TSV path or [source_file, target_file], got {spec!r}")


__all__ = ["Corpus", "decode_lines", "read_aligned_pairs", "read_lines", "read_pairs", "read_tsv_pairs"]
