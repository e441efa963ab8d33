"""Optional features live in extras (pyproject.toml); without its extra, a feature says which one to install."""

from __future__ import annotations

import sys

import pytest

from tests.formats import write_class_folders
from vit.commands import main
from vit.errors import MissingPackageError, find_user_error


def test_vit_shard_without_litdata_names_the_extra(tmp_path, monkeypatch, capsys):
    write_class_folders(tmp_path / "photos", ["a", "b"], per_class=4)
    monkeypatch.setitem(sys.modules, "litdata", None)  # what `import litdata` meets on a machine without it
    with pytest.raises(SystemExit) as done:
        main(["shard", str(tmp_path / "photos"), str(tmp_path / "shards")])
    err = capsys.readouterr().err
    assert done.value.code == 1, err
    assert "pip install 'vit[shards]'" in err and "Traceback" not in err and len(err.splitlines()) <= 5


def test_lightnings_missing_logger_package_names_the_extra():
    # Lightning 2.6's WandbLogger raises ModuleNotFoundError(str(RequirementCache("wandb>=0.12.10"))).
    error = ModuleNotFoundError("Requirement 'wandb>=0.12.10' not met. HINT: Try running `pip install -U 'wandb'`")
    wrapped = ValueError("Problem with given class_path 'lightning.pytorch.loggers.WandbLogger'")
    wrapped.__cause__ = error
    found = find_user_error(wrapped)
    assert isinstance(found, MissingPackageError) and "pip install 'vit[wandb]'" in str(found)
    assert find_user_error(ModuleNotFoundError("No module named 'numpy'", name="numpy")) is None  # a bug stays one
