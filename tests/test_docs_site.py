"""The documentation site is wired (the strict build itself runs in .ci/run, where it takes about 15 s): every page
of docs/ and every notebook is in mkdocs.yml's nav, the notebooks are docs/notebooks through a link (one source),
the build fails on every kind of broken link, and CI builds it strictly after installing the docs extra."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def nav_files(nav: list) -> list[str]:
    """The files of a (nested) mkdocs nav."""
    found = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        found += nav_files(value) if isinstance(value, list) else [value]
    return found


def test_every_page_and_notebook_is_in_the_nav_once():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs"
    in_nav = nav_files(config["nav"])
    docs = ROOT / "docs"
    pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md") if "notebooks" not in p.parts}
    notebooks = {f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert sorted(in_nav) == sorted(pages | notebooks) and len(in_nav) == len(set(in_nav))
    assert (docs / "notebooks").is_symlink() and (docs / "notebooks").resolve() == (ROOT / "notebooks").resolve()


def test_a_strict_build_fails_on_every_kind_of_broken_link_and_ci_runs_it():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["validation"] == {k: "warn" for k in ("omitted_files", "absolute_links", "unrecognized_links",
                                                        "anchors", "not_found")}
    jupyter = next(p["mkdocs-jupyter"] for p in config["plugins"] if isinstance(p, dict) and "mkdocs-jupyter" in p)
    assert jupyter["execute"] is False
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r'\npip install -q -e "\.\[docs\]" && .*mkdocs build --strict', ci)
    assert "$docs -eq 0" in ci
    extra = re.search(r"\ndocs = \[\n(.*?)\n\]", (ROOT / "pyproject.toml").read_text(), re.S).group(1)
    named = set(re.findall(r'^\s*"([a-z-]+)', extra, re.M))
    assert {"mkdocs", "mkdocs-material", "mkdocstrings", "mkdocs-jupyter"} <= named
    assert "vit[" not in extra  # installable on its own, without dev


def test_api_pages_name_objects_that_exist():
    """Each ``::: vit.x.Name`` of the API pages is importable (the strict build says so too, but later)."""
    import importlib

    targets = [t for page in (ROOT / "docs" / "api").glob("*.md")
               for t in re.findall(r"^::: (\S+)$", page.read_text(), re.M)]
    assert len(targets) >= 20
    for target in targets:
        module, _, name = target.rpartition(".")
        assert hasattr(importlib.import_module(module), name), target
