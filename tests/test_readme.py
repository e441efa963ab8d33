"""The README's commands run as written: every `vit ...` line in its bash blocks parses, and the digits
commands run end to end (a 1-epoch fit, then `vit test --ckpt_path best`)."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from vit.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
LIGHTNING = {"fit", "pretrain", "validate", "test", "predict"}


def readme_commands() -> list[list[str]]:
    """The `vit` command lines of the README's bash blocks, as argv lists (comments and continuations undone)."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(line, comments=True) for line in lines if line.startswith("vit ")]


def lightning_cli(argv: list[str]) -> bool:
    """Whether `vit` hands ``argv`` to LightningCLI (as `vit.commands.run` decides)."""
    return argv[0] in LIGHTNING and not (argv[0] == "predict" and any(a.startswith("--ckpt") for a in argv))


def test_the_readme_names_commands_that_exist():
    commands = readme_commands()
    assert len(commands) >= 20  # the extraction found the blocks
    unknown = [c for c in commands if c[1] not in COMMANDS]
    assert not unknown


# `vit translate --ckpt <best.ckpt> ...` names the reader's own file: not runnable as written, by design.
RUNNABLE = [c[1:] for c in readme_commands() if not any("<" in a for a in c)]


@pytest.mark.parametrize("argv", RUNNABLE, ids=lambda argv: " ".join(argv)[:70])
def test_every_readme_command_parses(argv, tmp_path, monkeypatch, capsys):
    """LightningCLI commands print their merged config (configs, keys and values all checked); the others
    parse their options. Checkpoints chosen by name (best/last) need a run: the slow test below."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    if lightning_cli(argv):
        if "--ckpt_path" in argv:
            at = argv.index("--ckpt_path")
            argv = argv[:at] + argv[at + 2:]
        from vit.cli import cli

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
        assert cli.trainer.callback_metrics[metric] > 0.3  # a trained checkpoint: chance is 0.1
