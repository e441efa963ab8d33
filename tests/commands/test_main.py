"""The `vit` console script: one line per command, and prediction without Lightning."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import subprocess_env
from vit.commands import COMMANDS, main


def test_vit_help_lists_every_command(capsys):
    main(["--help"])
    printed = capsys.readouterr().out
    for name, (_, summary) in COMMANDS.items():
        assert f"  {name}" in printed and summary in printed
    with pytest.raises(SystemExit):
        main(["nonsense"])
    assert "unknown command 'nonsense'" in capsys.readouterr().err


def test_prediction_side_imports_no_lightning():
    # nor onnx/onnxruntime: they load only for ONNX files. One fresh interpreter imports the modules in turn and
    # names each one that brought a heavy package in (the first to import it is the culprit).
    modules = ["vit.checkpoint", "vit.data.io", "vit.commands.predict", "vit.commands.attention",
               "vit.commands.export", "vit.commands.probe"]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "    heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'onnx', 'onnxruntime'))\n"
            "    print(name, heavy)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=subprocess_env())
    assert done.stdout.splitlines() == [f"{name} []" for name in modules]


def test_every_command_has_useful_help(capsys):
    for name in ("predict", "attention", "translate", "export"):
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        assert done.value.code == 0
        assert f"usage: vit {name}" in capsys.readouterr().out
