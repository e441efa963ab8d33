"""scripts/dev/mutants.py on a tiny git repository of two commits: the mutants it plans on the second commit's lines,
and one caught and one surviving mutant run end to end."""

from __future__ import annotations

import subprocess

import pytest

from tests import load_script

FIRST = '"""A module."""\n'
SECOND = FIRST + '''

def smaller(a, b):
    return a < b  # tested on (1, 2) and (2, 1) only: <= survives


def inc(x):
    """Add one (the docstring is never mutated: 1 < 2)."""
    return x + 1
'''
TEST = '''from vit.mod import inc, smaller


def test_mod():
    assert smaller(1, 2) and not smaller(2, 1)
    assert inc(1) == 2
'''


@pytest.fixture
def repo(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "vit").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "vit" / "__init__.py").write_text("")
    (tmp_path / "vit" / "mod.py").write_text(FIRST)
    git("add", "-A")
    git("commit", "-qm", "first")
    (tmp_path / "vit" / "mod.py").write_text(SECOND)
    (tmp_path / "tests" / "test_mod.py").write_text(TEST)
    git("add", "-A")
    git("commit", "-qm", "second")
    return tmp_path


def test_list_plans_the_mutants_of_the_changed_lines_only(repo, capsys):
    counts = load_script("mutants").main(["--base", "HEAD~1", "--root", str(repo), "--list"])
    out = capsys.readouterr().out.splitlines()
    assert "vit/mod.py:5  < -> <=  |  return a <= b  # tested on (1, 2) and (2, 1) only: <= survives" in out
    assert "vit/mod.py:10  1 -> 2  |  return x + 2" in out
    assert counts == {"planned": 2} and out[-1] == "mutants: 2 planned"  # the docstring and comment untouched
    # uncommitted changes count: a new line in the working tree is planned too
    (repo / "vit" / "mod.py").write_text(SECOND + "\n\ndef same(a, b):\n    return a == b\n")
    load_script("mutants").main(["--base", "HEAD", "--root", str(repo), "--list"])
    assert capsys.readouterr().out.splitlines() == ["vit/mod.py:14  == -> !=  |  return a != b", "mutants: 1 planned"]


def test_a_mutant_the_test_notices_is_caught_and_one_it_does_not_survives(repo, capsys):
    counts = load_script("mutants").main(["--base", "HEAD~1", "--root", str(repo), "--timeout", "120"])
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "mutants: 2 planted, 1 caught, 1 survived"
    assert [line.split() for line in out[:-1]] == [["vit/mod.py:5", "<", "->", "<=", "SURVIVED"],
                                                   ["vit/mod.py:10", "1", "->", "2", "caught"]]
    assert counts == {"planted": 2, "caught": 1, "survived": 1}
    assert (repo / "vit" / "mod.py").read_text() == SECOND  # the checkout untouched
