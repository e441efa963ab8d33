"""Plant small bugs in the lines a change touches, one at a time, and see whether the fast tests notice.

    python scripts/dev/mutants.py --base main                 # every mutant of `git diff main` under vit/
    python scripts/dev/mutants.py --base 452ab5e --max 40     # a deterministic sample of 40
    python scripts/dev/mutants.py --base HEAD~3 --list        # only list the planned mutants
    python scripts/dev/mutants.py --base main --files 'vit/deploy/*' --timeout 300

The lines: those added or changed by `git diff REV` (the uncommitted changes included) and untracked new files,
under vit/. The mutants: comparison and boundary flips (< <=, > >=, == !=), `and` <-> `or`, `min` <-> `max`, a
branch's other side (`if x:` -> `if not (x):`), swapped indices or two arguments ([a, b] -> [b, a]), a dropped
`.detach()` / normalisation call, constants nudged (0 -> 1, n -> n + 1, `1.0 - x` -> `x`). Each is planted in a
temporary copy of the working tree (your checkout is never touched) and the fast tests (-m "not slow") of the test
files that mirror the module (tests/<pkg>/test_<module>.py) or name it (vit.<pkg>.<module>) run against it. A
SURVIVED mutant is a change no test notices: answer it with a test, or a line saying why it is equivalent.

A dev tool, not run in CI (one pytest run per mutant: minutes). Run it on your diff before stopping.
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path
from typing import NamedTuple

FLIPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "and": "or", "or": "and",
         "min": "max", "max": "min"}
DROPPED = re.compile(r"\.(detach|sigmoid|softmax|log_softmax|clamp_min|exp|abs)\([^()]*\)")
NORMALISE = re.compile(r"\b(?:F\.)?normalize\(([^(),]+)(?:,[^()]*)?\)")
SWAP = re.compile(r"([\w\])])([\[(])([^\[\](),=:]+?), ([^\[\](),=:]+?)([\])])")  # f(a, b), x[a, b]; no slices
ONE_MINUS = re.compile(r"(?<![\w.])1(?:\.0)? - (?=[\w(])")
BRANCH = re.compile(r"^(\s*)(if|elif|while) (.+):\s*$")
PYTEST = ["-m", "not slow", "-x", "-q", "-p", "no:cacheprovider", "-n", "0"]


class Mutant(NamedTuple):  # (a NamedTuple: tests load this script without sys.modules)
    path: str  # relative to the repository root
    line: int  # 1-based
    old: str  # the whole line before
    new: str  # and after
    what: str  # e.g. "< -> <="


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def changed_lines(root: Path, base: str) -> dict[str, set[int]]:
    """{path: line numbers} added or changed under vit/ since ``base``, in the working tree."""
    found: dict[str, set[int]] = {}
    path = None
    for line in git(root, "diff", "-U0", base, "--", "vit/").splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else None
        elif line.startswith("@@") and path and path.endswith(".py"):
            start, _, count = re.match(r"@@ -\S+ \+(\d+)(,(\d+))? @@", line).groups()
            n = 1 if count is None else int(count)
            found.setdefault(path, set()).update(range(int(start), int(start) + n))
    for path in git(root, "ls-files", "--others", "--exclude-standard", "--", "vit/").splitlines():
        if path.endswith(".py"):
            found[path] = set(range(1, len((root / path).read_text().splitlines()) + 1))
    return {p: lines for p, lines in found.items() if lines}


def scan(source: str, wanted: set[int]) -> tuple[list[tuple[int, int, int, str, str]], dict[int, str]]:
    """The token mutants of ``wanted`` lines, (line, start col, end col, new text, description), and each line with
    its strings and comments blanked (what the line patterns may match): strings and comments are never mutated."""
    lines = source.splitlines(keepends=True)
    masked = {row: lines[row - 1] for row in wanted if row <= len(lines)}
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    out = []
    for tok, after in zip(tokens, tokens[1:] + tokens[-1:]):
        (row, col), (end_row, end_col) = tok.start, tok.end
        if tok.type in (tokenize.STRING, tokenize.COMMENT):
            for r in range(row, end_row + 1):
                if r in masked:
                    a, b = (col if r == row else 0), (end_col if r == end_row else len(masked[r]))
                    masked[r] = masked[r][:a] + " " * (b - a) + masked[r][b:]
            continue
        if row not in wanted:
            continue
        if tok.string in FLIPS and (tok.string not in ("min", "max") or after.string == "("):
            out.append((row, col, end_col, FLIPS[tok.string], f"{tok.string} -> {FLIPS[tok.string]}"))
        elif tok.type == tokenize.NUMBER and re.fullmatch(r"\d+(\.\d*)?", tok.string):
            value = float(tok.string) + 1 if "." in tok.string else int(tok.string) + 1
            out.append((row, col, end_col, str(value), f"{tok.string} -> {value}"))
    return out, masked


def line_mutants(text: str, code: str) -> list[tuple[str, str]]:
    """(new line, description) of one line's patterns, matched on ``code`` (the line with its strings blanked):
    swapped pairs, dropped calls, `1 - x` -> `x`, the branch's other side."""
    out = []
    for m in SWAP.finditer(code):
        a, b = text[m.start(3):m.end(3)].strip(), text[m.start(4):m.end(4)].strip()
        if a != b and not {a[0], b[0]} & {"*", "."}:  # not *args, not tuple[int, ...]
            out.append((text[:m.start(3)] + b + ", " + a + text[m.end(4):],
                        f"{m.group(2)}{a}, {b}{m.group(5)} -> {m.group(2)}{b}, {a}{m.group(5)}"))
    for m in DROPPED.finditer(code):
        out.append((text[:m.start()] + text[m.end():], f"drop {text[m.start():m.end()]}"))
    for m in NORMALISE.finditer(code):
        inner = text[m.start(1):m.end(1)]
        out.append((text[:m.start()] + inner + text[m.end():], f"drop normalize({inner})"))
    for m in ONE_MINUS.finditer(code):
        out.append((text[:m.start()] + text[m.end():], f"drop {m.group(0).strip()}"))
    if (m := BRANCH.match(code)) and not m.group(3).startswith("not "):
        condition = text[m.start(3):m.end(3)]
        out.append((f"{text[:m.start(3)]}not ({condition}){text[m.end(3):]}",
                    f"{m.group(2)} x: -> {m.group(2)} not x:"))
    return out


def plan(root: Path, base: str, pattern: str | None) -> list[Mutant]:
    """Every mutant of the changed lines that still compiles, in file and line order."""
    mutants = []
    for path, wanted in sorted(changed_lines(root, base).items()):
        if pattern and not fnmatch.fnmatch(path, pattern):
            continue
        source = (root / path).read_text()
        lines = source.splitlines(keepends=True)
        tokens, masked = scan(source, wanted)
        found = [(row, lines[row - 1][:a] + new + lines[row - 1][b:], what) for row, a, b, new, what in tokens]
        found += [(row, new, what) for row in sorted(masked) if not masked[row].lstrip().startswith("def ")
                  for new, what in line_mutants(lines[row - 1], masked[row])]
        for row, new, what in sorted(found, key=lambda f: f[0]):
            mutated = "".join([*lines[:row - 1], new, *lines[row:]])
            try:
                compile(mutated, path, "exec")
            except SyntaxError:
                continue
            mutants.append(Mutant(path, row, lines[row - 1], new, what))
    return mutants


def tests_for(root: Path, path: str) -> list[str]:
    """The test files that mirror ``path`` (vit/a/b.py -> tests/a/test_b.py) or name its module (vit.a.b)."""
    parts = Path(path).with_suffix("").parts[1:]
    mirror = Path("tests", *parts[:-1], f"test_{parts[-1]}.py")
    dotted = re.compile(r"\b" + re.escape(".".join(("vit", *parts))) + r"\b")
    named = {str(t.relative_to(root)) for t in (root / "tests").rglob("test_*.py") if dotted.search(t.read_text())}
    return sorted(named | ({str(mirror)} if (root / mirror).is_file() else set()))


def copy_tree(root: Path, into: Path) -> None:
    """The working tree's files as git sees them (tracked and untracked, not ignored), uncommitted changes in."""
    for name in git(root, "ls-files", "-co", "--exclude-standard", "-z").split("\0"):
        if name and (root / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, into / name)


def run_tests(copy: Path, tests: list[str], timeout: float) -> str:
    """caught / SURVIVED / timeout / no tests for one pytest run in ``copy``."""
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}  # no stale .pyc of a mutant
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", *PYTEST, *tests], cwd=copy, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    return {0: "SURVIVED", 5: "no tests"}.get(done.returncode, "caught")  # 1 failed, 2 import/collection error


def main(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision the change is measured from (git diff REV)")
    parser.add_argument("--max", type=int, default=None, help="plant at most N, a deterministic sample")
    parser.add_argument("--files", default=None, help="only files matching this glob (e.g. 'vit/deploy/*')")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutant's test run")
    parser.add_argument("--list", action="store_true", help="list the planned mutants, run nothing")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository (default: here)")
    args = parser.parse_args(argv)
    root = Path(git(args.root, "rev-parse", "--show-toplevel").strip())
    mutants = plan(root, args.base, args.files)
    if args.max is not None and len(mutants) > args.max:
        chosen = set(random.Random(0).sample(range(len(mutants)), args.max))
        mutants = [m for i, m in enumerate(mutants) if i in chosen]
    if args.list:
        for m in mutants:
            print(f"{m.path}:{m.line}  {m.what}  |  {m.new.strip()}")
        print(f"mutants: {len(mutants)} planned")
        return {"planned": len(mutants)}
    results = []
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        copy = Path(tmp)
        copy_tree(root, copy)
        baseline: dict[tuple[str, ...], str] = {}  # a test set that fails unmutated would "catch" every mutant
        for i, m in enumerate(mutants, 1):
            tests = tests_for(copy, m.path)
            key = tuple(tests)
            if tests and key not in baseline:
                baseline[key] = run_tests(copy, tests, args.timeout)
            target = copy / m.path
            original = target.read_text()
            lines = original.splitlines(keepends=True)
            target.write_text("".join([*lines[:m.line - 1], m.new, *lines[m.line:]]))
            try:
                if not tests:
                    result = "no tests"
                elif baseline[key] != "SURVIVED":  # (that is: passed)
                    result = f"baseline {baseline[key]}"
                else:
                    result = run_tests(copy, tests, args.timeout)
            finally:
                target.write_text(original)
            results.append((m, result))
            print(f"\r[{i}/{len(mutants)}] {m.path}:{m.line} {m.what}: {result}".ljust(100), end="",
                  file=sys.stderr, flush=True)
    print(file=sys.stderr)
    for m, result in results:
        print(f"{m.path}:{m.line:<5} {m.what:<40} {result}")
    counts = {"planted": len(results), "caught": sum(r == "caught" for _, r in results),
              "survived": sum(r == "SURVIVED" for _, r in results)}
    others = len(results) - counts["caught"] - counts["survived"]
    print(f"mutants: {counts['planted']} planted, {counts['caught']} caught, {counts['survived']} survived"
          + (f", {others} other (timeout, no tests, baseline failing)" if others else ""))
    return counts


if __name__ == "__main__":
    main()
