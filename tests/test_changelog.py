"""CHANGELOG.md and the version: one place for the version (vit/__init__.py), the changelog's newest entry equal to
it, and the release that its Deprecated section names equal to the one the old import paths warn of."""

from __future__ import annotations

import re
from pathlib import Path

import vit
from vit._graveyard import REMOVED_IN

ROOT = Path(__file__).resolve().parents[1]
# keepachangelog's release heading: ## [0.2.0] - 2026-12-06
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.MULTILINE)


def releases() -> list[tuple[str, str, str]]:
    """(version, date, the entry's text) for each release in CHANGELOG.md, newest first as written."""
    text = (ROOT / "CHANGELOG.md").read_text()
    found = list(RELEASE.finditer(text))
    ends = [m.start() for m in found[1:]] + [len(text)]
    return [(m.group(1), m.group(2), text[m.end():end]) for m, end in zip(found, ends)]


def as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_the_newest_changelog_entry_is_the_package_version():
    entries = releases()
    assert entries, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' heading"
    assert entries[0][0] == vit.__version__


def test_the_entries_run_newest_first_and_each_is_dated():
    versions = [as_tuple(v) for v, _, _ in releases()]
    dates = [d for _, d, _ in releases()]
    assert len(versions) >= 2 and versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    assert dates == sorted(dates, reverse=True)


def test_the_newest_entry_says_when_its_deprecations_go():
    entry = releases()[0][2]
    deprecated = entry.split("### Deprecated", 1)[1].split("\n### ", 1)[0]
    assert f"go in {REMOVED_IN}" in deprecated
    assert as_tuple(REMOVED_IN) > as_tuple(vit.__version__)


def test_the_version_is_written_in_one_place():
    # pyproject.toml reads vit.__version__ (setuptools' dynamic attr), so no second copy can drift from it
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert not re.search(r"^version\s*=\s*\"", pyproject, re.MULTILINE)  # no literal version (tomllib is 3.11+)
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.MULTILINE)
    assert re.search(r'^version = \{ attr = "vit.__version__" \}', pyproject, re.MULTILINE)
    spelt = [p for p in (ROOT / "vit").rglob("*.py") if re.search(r"__version__\s*=", p.read_text())]
    assert spelt == [ROOT / "vit" / "__init__.py"]
