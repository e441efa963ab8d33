"""The README's and docs/' commands run as written: its opening block is what CI runs, every `vit ...` line of
their bash blocks parses, every `python scripts/...` command parses with its script's own parser, and the
digits commands run end to end (a short fit, then `vit test --ckpt_path best`)."""

from __future__ import annotations

import argparse
import importlib
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from vit.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
LIGHTNING = {"fit", "pretrain", "validate", "test", "predict"}
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def bash_lines(page: Path) -> list[str]:
    """The lines of a page's bash blocks, continuations undone."""
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)
    return [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def as_vit_argv(line: str) -> list[str] | None:
    """``vit ...`` (also after ``srun`` or ``torchrun ... -m``) as argv from "vit", else None."""
    argv = shlex.split(line, comments=True)
    if argv[:1] == ["srun"]:
        argv = argv[1:]
    if argv[:1] == ["torchrun"] and "-m" in argv:
        argv = argv[argv.index("-m") + 1:]
    return argv if argv[:1] == ["vit"] else None


def readme_commands(pages: list[Path] = PAGES) -> list[list[str]]:
    """The `vit` command lines of the pages' bash blocks, as argv lists."""
    return [argv for page in pages for line in bash_lines(page) if (argv := as_vit_argv(line))]


def script_commands() -> list[list[str]]:
    """``python scripts/NAME.py ...`` commands, in bash blocks and in inline code, as argv from the script path."""
    found = []
    for page in PAGES:
        text = page.read_text()
        spans = bash_lines(page) + re.findall(r"`([^`\n]*python scripts/[^`\n]*)`", text)
        for span in spans:
            argv = shlex.split(span[span.index("python scripts/"):], comments=True) if "python scripts/" in span else []
            if argv and "[" not in span and "<" not in span and "..." not in span:
                found.append(argv[1:])
    return found


def test_the_opening_block_is_the_two_commands_ci_runs():
    """The README opens with the main job and the tests, and .ci/run runs that test command word for word."""
    opening = [line for line in bash_lines(ROOT / "README.md")[:4] if not line.startswith("#")]
    assert opening == ["pip install -e . && vit fit --config configs/digits.yaml",
                       'pip install -q -e ".[dev]" && python -m pytest -q']
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"README_TESTS='{opening[1]}'" in ci and '\neval "$README_TESTS"\n' in ci
    assert "python3 -m venv" in ci and "--system-site-packages" not in ci and "deptry ." in ci


def test_the_readme_is_short_and_its_links_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    for target in re.findall(r"\]\(((?:docs|notebooks)/[^)#]+)", readme):
        assert (ROOT / target).is_file(), target


def test_the_readme_names_commands_that_exist():
    commands = readme_commands()
    assert len(commands) >= 40  # the extraction found the blocks of the README and docs/
    unknown = [c for c in commands if c[1] not in COMMANDS]
    assert not unknown


class Parsed(Exception):
    """Raised in place of running a script once its arguments parsed."""


@pytest.mark.parametrize("argv", script_commands(), ids=lambda argv: " ".join(argv)[:70])
def test_every_script_command_parses(argv, monkeypatch):
    """Each script runs up to its argument parsing with the documented arguments, and stops there."""
    assert (ROOT / argv[0]).is_file(), argv[0]
    parse_args, parse_known_args = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    inside = []  # parse_args calls parse_known_args, then refuses what is left: that refusal is checked too

    def parse_then_stop(self, args=None, namespace=None):
        inside.append(True)
        try:
            parse_args(self, args, namespace)
        finally:
            inside.pop()
        raise Parsed

    def parse_known_then_stop(self, args=None, namespace=None):  # a script that hands the rest on (LightningCLI)
        found = parse_known_args(self, args, namespace)
        if inside:
            return found
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_then_stop)
    monkeypatch.setattr(sys, "argv", [str(ROOT / argv[0]), *argv[1:]])
    monkeypatch.syspath_prepend(str((ROOT / argv[0]).parent))  # as running it does: its siblings import by name
    with pytest.raises(Parsed):
        runpy.run_path(str(ROOT / argv[0]), run_name="__main__")


def lightning_cli(argv: list[str]) -> bool:
    """Whether `vit` hands ``argv`` to LightningCLI (as `vit.commands.run` decides)."""
    return argv[0] in LIGHTNING and not (argv[0] == "predict" and any(a.startswith("--ckpt") for a in argv))


# `vit translate --ckpt <best.ckpt> ...` names the reader's own file: not runnable as written, by design.
RUNNABLE = [c[1:] for c in readme_commands() if not any("<" in a for a in c)]


@pytest.mark.parametrize("argv", RUNNABLE, ids=lambda argv: " ".join(argv)[:70])
def test_every_readme_command_parses(argv, tmp_path, monkeypatch, capsys):
    """LightningCLI commands print their merged config (configs, keys and values all checked); the others
    parse their options. Checkpoints chosen by name (best/last) need a run: the slow test below."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "lines.txt").write_text("4 1 7\n")  # `vit translate --file lines.txt` reads the reader's own file
    if lightning_cli(argv):
        if "--ckpt_path" in argv:
            at = argv.index("--ckpt_path")
            argv = argv[:at] + argv[at + 2:]
        from vit.cli.main import cli

        with pytest.raises(SystemExit) as done:
            cli([*argv, "--print_config"])
        assert done.value.code in (0, None), capsys.readouterr().err
        assert "model:" in capsys.readouterr().out
        return
    module = importlib.import_module(COMMANDS[argv[0]][0])
    if "--help" in argv:
        with pytest.raises(SystemExit) as done:
            module.parse_args(argv[1:])
        assert done.value.code == 0
        return
    assert module.parse_args(argv[1:])


@pytest.mark.slow
def test_the_readme_digits_commands_run_as_written(tmp_path, monkeypatch, capsys):
    """`vit fit --config configs/digits.yaml` (3 epochs), then the README's `vit test ... --ckpt_path best`
    and `vit validate ... --ckpt_path last`, word for word."""
    from vit.commands import run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    commands = [c[1:] for c in readme_commands() if c[1] in ("test", "validate") and "configs/digits.yaml" in c]
    assert {c[0] for c in commands} == {"test", "validate"}
    quick = ["--trainer.max_epochs", "3", "--trainer.enable_progress_bar", "false"]
    run(["fit", "--config", "configs/digits.yaml", *quick])
    for argv in commands:
        cli = run([*argv, "--trainer.enable_progress_bar", "false"])
        metric = "test_acc" if argv[0] == "test" else "val_acc"
        # a trained checkpoint: chance is 0.1; 3 epochs gave 0.25-0.41 test top-1 over seeds 0-3, before and after
        # the resumable loader changed the draw order (0.3 failed on one seed of each)
        assert cli.trainer.callback_metrics[metric] > 0.2
