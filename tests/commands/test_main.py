"""The `vit` console script: one line per command, and prediction without Lightning."""

from __future__ import annotations

import re
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
    modules = ["vit.deploy", "vit.checkpoints", "vit.data.io", "vit.commands.predict", "vit.commands.attention",
               "vit.commands.export", "vit.commands.probe", "vit.commands.average"]
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


@pytest.mark.parametrize("command, option_kind", [("predict", "file"), ("export", "folder"), ("attention", "folder")])
def test_an_output_that_cannot_be_written_is_named_before_any_work(command, option_kind, tmp_path, capsys):
    """--out that is a folder where a file goes, a file where a folder goes, under a file, or a folder named like a
    file once failed with a traceback after the predictions, the export or the figures were computed."""
    import importlib

    parse_args = importlib.import_module(f"vit.commands.{command}").parse_args
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file.txt").write_text("x")
    rest = {"predict": ["--ckpt", "m.ckpt", "photos"], "export": ["--ckpt", "m.ckpt", "--format", "onnx"],
            "attention": ["--ckpt", "m.ckpt", "photos"]}[command]
    wrong = {"file": {"a_folder": "is a folder; name a file in it", "a_file.txt/p.csv": "a_file.txt is a file, so"},
             "folder": {"a_file.txt": "is a file; name a folder", "a_file.txt/sub": "a_file.txt is a file, so",
                        "exp/model.onnx": "looks like a file name, but this is the folder"}}[option_kind]
    for out, words in wrong.items():
        with pytest.raises(SystemExit):
            parse_args([*rest, "--out", str(tmp_path / out)])
        said = capsys.readouterr().err
        assert f"--out: {tmp_path / out.split('/')[0]}" in said and words in said, (out, said)
    # what is right passes: a new file or folder, also under folders that do not exist yet
    new = "new/p.csv" if option_kind == "file" else "new/folder"
    assert str(parse_args([*rest, "--out", str(tmp_path / new)]).out) == str(tmp_path / new)


def test_a_checkpoint_folder_given_as_a_checkpoint_names_its_files_and_its_best(fitted, tmp_path):
    """`vit predict --ckpt logs/.../checkpoints` said only that a folder is no checkpoint: it now names the
    checkpoints inside and the run's best, which loads."""
    from vit.checkpoints.io import read_checkpoint
    from vit.deploy import load_classifier

    folder = fitted / "ckpt"
    (best,) = folder.glob("best-*.ckpt")
    expected = (rf"ckpt is a folder, not a checkpoint .*; it holds {re.escape(best.name)}, last\.ckpt: pass one of "
                rf"them, e\.g\. its run's best, {re.escape(str(best))}$")
    with pytest.raises(FileNotFoundError, match=expected) as err:
        read_checkpoint(folder)
    assert load_classifier(str(err.value).rsplit(" ", 1)[-1]).class_names
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty is a folder, not a checkpoint \(a sharded checkpoint folder "
                       r"holds meta\.pt and \.metadata\)$"):
        read_checkpoint(tmp_path / "empty")
