"""The package's shape, read from the source: imports run downward (no circle), `vit.deploy` runs without Lightning
or the CLI, and tests/ mirrors vit/. (The 0.1 import paths: tests/test_graveyard.py.)"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import subprocess_env

VIT = Path(__file__).resolve().parents[1] / "vit"
TESTS = Path(__file__).resolve().parent


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(VIT.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_graph() -> dict[str, set[str]]:
    """Each module of vit/ -> the modules of vit/ it imports (at any depth of its code, lazy imports included)."""
    modules = {module_name(p): p for p in VIT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join([*parts[: len(parts) - node.level + 1], base]).strip(".")
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                # a module's own package (its __init__) runs before it: no edge back up
                if target and target != name and not name.startswith(target + "."):
                    found.add(target)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_circle():
    assert cycles(import_graph()) == []


def test_the_circle_finder_finds_one():
    # the check above must be able to fail: a two-module circle and a three-module one
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c", "a"}, "f": set()}
    assert sorted(cycles(graph)) == [["a", "b"], ["c", "d", "e"]]


def test_deploy_reaches_neither_lightning_nor_the_cli_in_the_source():
    graph = import_graph()
    for start in (m for m in graph if m.startswith("vit.deploy")):
        seen, todo = set(), [start]
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo += graph[module]
        assert not [m for m in seen if m == "vit.cli" or m.startswith("vit.cli.")], start
        for module in seen:
            path = VIT.parent / (module.replace(".", "/") + ".py")
            source = (path if path.exists() else path.with_suffix("") / "__init__.py").read_text()
            names = [alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
                     for alias in node.names]
            names += [node.module or "" for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)]
            assert not [n for n in names if n.split(".")[0] in ("lightning", "pytorch_lightning")], (start, module)


def test_deploy_imports_no_lightning_when_run():
    # every module of vit.deploy in one fresh interpreter: none brings Lightning or vit.cli into sys.modules
    modules = sorted(module_name(p) for p in (VIT / "deploy").glob("*.py"))
    code = (f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'lightning' or m.startswith('vit.cli')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=subprocess_env())
    assert done.stdout.strip() == "[]"


def test_the_cli_package_stays_light_until_a_name_is_asked_for():
    # vit.cli.preflight runs before Lightning is imported (`vit fit` with weights that cannot be had fails fast)
    code = "import sys, vit.cli.preflight; print(any(m.split('.')[0] == 'lightning' for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=subprocess_env())
    assert done.stdout.strip() == "False"


def mirrored_test(path: Path) -> Path:
    """Where the tests of ``vit/X/Y.py`` live: ``tests/X/test_Y.py`` (docs/development.md)."""
    relative = path.relative_to(VIT)
    return TESTS / relative.parent / f"test_{relative.name}"


def test_every_module_has_a_test_file_at_its_mirrored_path():
    """tests/ mirrors vit/: a module's tests are found where its path says. Packages' __init__, private modules
    (_graveyard, __main__) have no file of their own."""
    missing = [f"{p.relative_to(VIT.parent)} -> {mirrored_test(p).relative_to(TESTS.parent)}"
               for p in sorted(VIT.rglob("*.py"))
               if not p.name.startswith("_") and not mirrored_test(p).exists()]
    assert not missing, "modules without a test file at the mirrored path:\n  " + "\n  ".join(missing)


def named_in(docstring: str, package: str, module: str) -> bool:
    """Whether a package's docstring names ``module``: as ``module.py`` or as ``vit.package.module``."""
    return bool(re.search(rf"(?<![\w.]){module}\.py\b|\b{re.escape(package)}\.{module}\b", docstring))


def test_each_package_docstring_lists_its_modules():
    """A package's docstring is its table of contents: every module file in it is named there (a new module
    too)."""
    assert named_in("    io.py  files", "vit.x", "io") and named_in("see `vit.x.io`", "vit.x", "io")
    assert not named_in("the audio.py file, vit.x.iox", "vit.x", "io")  # a longer name is not this one
    unlisted = []
    for init in sorted(VIT.rglob("__init__.py")):
        if init.parent == VIT:
            continue
        package = module_name(init)
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        unlisted += [f"{package}: {p.name}" for p in sorted(init.parent.glob("*.py"))
                     if not p.name.startswith("__") and not named_in(docstring, package, p.stem)]
    assert not unlisted, "modules their package's docstring does not name:\n  " + "\n  ".join(unlisted)


# embed_dim=32, "embed_dim": 32, embed_dim: 32 (a YAML flow map in a command line), "--model.init_args.embed_dim=32"
SPELT_TINY = re.compile(r"embed_dim\W{1,4}32\b")


def test_the_tiny_width_is_spelt_once():
    """Tests build tiny models of one width, `tests.helpers.TINY_DIM`: a test file that writes the number out
    instead drifts when the size changes."""
    assert SPELT_TINY.search('dict(embed_dim=32)') and SPELT_TINY.search('"{depth: 1, embed_dim: 32}"')
    assert not SPELT_TINY.search("embed_dim=320") and not SPELT_TINY.search("embed_dim=TINY_DIM")
    spelt = [f"{p.relative_to(TESTS)}:{i}" for p in sorted(TESTS.rglob("*.py")) if p.name != "helpers.py"
             and p != Path(__file__).resolve()
             for i, line in enumerate(p.read_text().splitlines(), 1) if SPELT_TINY.search(line)]
    assert not spelt, "the tiny width written out (use tests.helpers.TINY_DIM):\n  " + "\n  ".join(spelt)


def imports_module(test_file: Path, module: str) -> bool:
    """Whether ``test_file`` imports ``module`` (``import vit.x.y``, ``from vit.x.y import ...``, ``from vit.x
    import y``), at the top or inside a test."""
    package, _, name = module.rpartition(".")
    for node in ast.walk(ast.parse(test_file.read_text())):
        if isinstance(node, ast.Import) and any(a.name == module or a.name.startswith(module + ".")
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == module or node.module.startswith(module + "."):
                return True
            if node.module == package and any(a.name == name for a in node.names):
                return True
    return False


def test_each_mirrored_test_file_imports_the_module_it_tests():
    """A module's test file exercises that module, not only something near it: it imports it (by the AST)."""
    sample = TESTS / "nn" / "test_layers.py"
    assert imports_module(sample, "vit.nn.layers") and not imports_module(sample, "vit.nn.lay")
    not_importing = {str(mirrored_test(p).relative_to(TESTS.parent)) for p in sorted(VIT.rglob("*.py"))
                     if not p.name.startswith("_") and mirrored_test(p).exists()
                     and not imports_module(mirrored_test(p), module_name(p))}
    assert not not_importing, "test files that do not import the module they mirror:\n  " + "\n  ".join(
        sorted(not_importing))
