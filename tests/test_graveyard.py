"""The old import paths (vit/_graveyard.py): each works until 0.3.0, its names are the new modules' own objects, and
its DeprecationWarning names the new path and the release the old one goes in."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import vit
from tests.conftest import subprocess_env
from vit import _graveyard
from vit._graveyard import GONE, MODULES, NAMES, NEW_NAMES, REMOVED_IN, RENAMED

VIT = Path(vit.__file__).parent
# (old module, a name it had in 0.1, where the name lives now): a hand-written sample, independent of the table
MOVED = [
    ("vit.checkpoint", "Classifier", "vit.deploy.classifier"),
    ("vit.checkpoint", "read_checkpoint", "vit.checkpoints.io"),
    ("vit.checkpoint", "expect_task", "vit.checkpoints.meta"),
    ("vit.checkpoint", "run_checkpoint_folders", "vit.checkpoints.runs"),
    ("vit.checkpoint", "load_classifier", "vit.deploy.backends"),
    ("vit.weights", "load_pretrained", "vit.checkpoints.weights"),
    ("vit.weights", "convert_npz", "vit.checkpoints.convert"),
    ("vit.convert", "convert_npz", "vit.checkpoints.convert"),
    ("vit.backends", "BACKENDS", "vit.deploy.backends"),
    ("vit.inference", "OnnxClassifier", "vit.deploy.inference"),
    ("vit.inference", "onnx_metadata", "vit.deploy.metadata"),
    ("vit.export", "export_onnx", "vit.deploy.export"),
    ("vit.export", "METADATA_KEYS", "vit.deploy.metadata"),
    ("vit.quantize", "quantize_static_int8", "vit.deploy.quantize"),
    ("vit.quantize", "config_split_images", "vit.cli.data"),
    ("vit.quantize", "calibration_images", "vit.cli.data"),  # 0.1's took a config too: cli.data's does
    ("vit.fusion", "fuse_attention", "vit.deploy.fusion"),
    ("vit.cpu", "has_vnni", "vit.deploy.cpu"),
    ("vit.image_files", "ImagePaths", "vit.deploy.image_files"),
    ("vit.cli_parser", "VitArgumentParser", "vit.cli.parser"),
    ("vit.console", "ProgressBar", "vit.cli.console"),
    ("vit.preflight", "check_pretrained", "vit.cli.preflight"),
    ("vit.training", "LastCheckpoint", "vit.cli.training"),
    ("vit.cli", "experiment_folder", "vit.checkpoints.runs"),
    ("vit.cli", "TrainingCurves", "vit.cli.training"),
    ("vit.features", "new_run_folder", "vit.checkpoints.runs"),
    # 0.2's task layer (issue 62)
    ("vit.tasks.adapters", "PartialEma", "vit.tasks.ema"),
    ("vit.tasks.adapters", "ema_copy", "vit.tasks.ema"),
    ("vit.tasks.classify", "MOVED", "vit.tasks.compat"),
    ("vit.tasks.classify", "old_arguments", "vit.tasks.compat"),
    ("vit.tasks.classify", "upgraded_hparams", "vit.tasks.compat"),
    ("vit.tasks.contrastive", "check_head_init", "vit.tasks.classify"),
    ("vit.tasks.finetune", "STRATEGIES", "vit.tasks.compat"),
    ("vit.preprocessing", "pretrained_preprocessing", "vit.checkpoints.pretrained_cfg"),
    ("vit.checkpoints.lora", "load_base", "vit.checkpoints.weights"),
    ("vit.checkpoints.lora", "load_merged", "vit.checkpoints.weights"),
    ("vit.checkpoints.weights", "hub_cache", "vit.checkpoints.hub"),
    ("vit.checkpoints.weights", "HF_HUB", "vit.checkpoints.hub"),
]
# (old module, old name, new module, new name): renamed as they moved
MOVED_RENAMED = [
    ("vit.tasks.finetune", "LoraOptions", "vit.tasks.finetune", "Adapters"),
    ("vit.tasks.multilabel", "LabelEvaluation", "vit.tasks.multilabel", "MultiLabelEvaluation"),
]
# (old module, old name, what its error must name): gone with no successor (GONE_SAMPLE, below)


def deprecations(action: Callable[[], Any]) -> tuple[Any, list[str]]:
    """What ``action`` returns, and the messages of the DeprecationWarnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = action()
    return found, [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


def fresh_import(name: str) -> Any:
    """Import ``name`` again, as a notebook's first import of it does (its import warning is given once)."""
    sys.modules.pop(name, None)
    return importlib.import_module(name)


GONE_SAMPLE = [
    ("vit.tasks.adapters", "AdapterTraining", "vit.tasks.finetune.Adapters"),
    ("vit.tasks.finetune", "check_strategy", "strategy.check(depth)"),
    ("vit.tasks.finetune", "frozen_parts", "strategy.frozen(network, roles, epoch)"),
    ("vit.tasks.finetune", "unfreeze_epoch", "strategy.unfreeze_epoch()"),
    ("vit.tasks.multilabel", "label_test_report", "vit.tasks.multilabel.label_report"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED, ids=[f"{o}.{n}" for o, n, _ in MOVED])
def test_an_old_name_is_the_new_object_and_its_warning_names_the_new_path(old, name, new):
    found, messages = deprecations(lambda: getattr(importlib.import_module(old), name))
    assert found is getattr(importlib.import_module(new), name)
    assert any(f"{new}.{name}" in m and f"goes in {REMOVED_IN}" in m for m in messages), messages


@pytest.mark.parametrize("old", sorted(MODULES))
def test_an_old_module_imports_with_a_warning_naming_its_new_modules(old):
    module, messages = deprecations(lambda: fresh_import(old))
    assert module.__name__ == old
    assert any(all(new in m for new in MODULES[old]) and REMOVED_IN in m for m in messages), messages
    assert not VIT.joinpath(*old.split(".")[1:]).with_suffix(".py").exists()  # no file: the table is the only place


def defined_in(module: str) -> list[str]:
    """The public functions and classes that ``module`` itself defines (not those it imports)."""
    return [n for n, v in vars(importlib.import_module(module)).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == module]


@pytest.mark.parametrize(("old", "new"), [(o, n) for o, news in MODULES.items() for n in news])
def test_every_name_a_new_module_defines_is_an_attribute_of_the_old_one(old, new):
    # the first module of the entry that defines a name is its home (vit.quantize.calibration_images: cli.data's)
    earlier = {n for m in MODULES[old][: MODULES[old].index(new)] for n in defined_in(m)}
    names = [n for n in defined_in(new) if n not in earlier]
    assert names, f"{new} defines nothing {old} could give"
    deprecations(lambda: importlib.import_module(old))  # its own import warning, given once, is another test's
    for name in names:
        found, messages = deprecations(lambda name=name: getattr(importlib.import_module(old), name))
        assert found is getattr(importlib.import_module(new), name), name
        assert messages == [f"{old}.{name} moved to {new}.{name}: import it from {new} (the old path goes in "
                            f"{REMOVED_IN})"]


@pytest.mark.parametrize(("module", "name"), sorted(NAMES))
def test_a_name_that_left_a_module_still_there_is_found_with_a_warning(module, name):
    found, messages = deprecations(lambda: getattr(importlib.import_module(module), name))
    assert found is getattr(importlib.import_module(NAMES[module, name]), name)
    assert any(f"{NAMES[module, name]}.{name}" in m and REMOVED_IN in m for m in messages), messages


@pytest.mark.parametrize(("old", "name", "new", "new_name"), MOVED_RENAMED,
                         ids=[f"{o}.{n}" for o, n, *_ in MOVED_RENAMED])
def test_a_renamed_name_is_the_new_object_and_its_warning_names_it(old, name, new, new_name):
    found, messages = deprecations(lambda: getattr(importlib.import_module(old), name))
    assert found is getattr(importlib.import_module(new), new_name)
    assert any(f"{old}.{name} is now {new}.{new_name}" in m and REMOVED_IN in m for m in messages), messages


@pytest.mark.parametrize(("module", "name"), sorted(NEW_NAMES))
def test_every_renamed_entry_gives_the_new_object(module, name):
    new, new_name = NEW_NAMES[module, name]
    found, messages = deprecations(lambda: getattr(importlib.import_module(module), name))
    assert found is getattr(importlib.import_module(new), new_name)
    assert name not in vars(importlib.import_module(module))  # found by the table, not left behind
    assert any(f"{new}.{new_name}" in m and REMOVED_IN in m for m in messages), messages


@pytest.mark.parametrize(("old", "name", "advice"), GONE_SAMPLE, ids=[f"{o}.{n}" for o, n, _ in GONE_SAMPLE])
def test_a_gone_name_is_an_import_error_saying_what_to_use(old, name, advice):
    deprecations(lambda: importlib.import_module(old))
    with pytest.raises(ImportError, match="is gone") as caught:
        exec(f"from {old} import {name}", {})  # as a user's line writes it: from ... import keeps the message
    assert f"{old}.{name}" in str(caught.value) and advice in str(caught.value)


@pytest.mark.parametrize(("module", "name"), sorted(GONE))
def test_every_gone_entry_raises_its_advice_and_the_module_lacks_it(module, name):
    deprecations(lambda: importlib.import_module(module))
    with pytest.raises(ImportError) as caught:
        getattr(importlib.import_module(module), name)
    assert str(caught.value) == f"{module}.{name} is gone (since 0.2): {GONE[module, name]}"
    assert name not in vars(importlib.import_module(module))


def test_the_gone_adapters_module_names_the_strategy_on_import():
    _, messages = deprecations(lambda: fresh_import("vit.tasks.adapters"))
    assert any("vit.tasks.ema" in m and "AdapterTraining is gone" in m and "vit.tasks.finetune.Adapters" in m
               for m in messages), messages


# the renamed loaders answer where 0.1 had them, and in vit.deploy, whose __all__ named them until 0.2
RENAMED_AT = [("vit.backends", "load_backend"), ("vit.inference", "load_model"), ("vit.deploy", "load_backend"),
              ("vit.deploy", "load_model")]


@pytest.mark.parametrize(("module", "name"), RENAMED_AT)
def test_a_renamed_loader_calls_load_classifier_with_a_warning(module, name, monkeypatch):
    calls = []
    monkeypatch.setattr("vit.deploy.backends.load_classifier", lambda *a, **kw: calls.append((a, kw)) or "loaded")
    loader, messages = deprecations(lambda: getattr(importlib.import_module(module), name))
    assert any(RENAMED[name] in m and REMOVED_IN in m for m in messages), messages
    assert loader("m.ckpt", **({"backend": "onnxruntime"} if name == "load_backend" else {})) == "loaded"
    assert calls == [(("m.ckpt", "cpu"), {"backend": "onnxruntime"} if name == "load_backend" else {})]
    assert name not in importlib.import_module("vit.deploy").__all__


def test_a_name_no_module_had_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match=r"moved to vit\.checkpoints\.io"):
        importlib.import_module("vit.checkpoint").no_such_name  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        importlib.import_module("vit.deploy").no_such_name  # noqa: B018
    assert not hasattr(importlib.import_module("vit.weights"), "__path__")  # a module, not a package


def test_the_table_never_answers_for_a_real_module():
    # the finder answers for the table's names only; a module of 0.2 is found where it lives
    assert _graveyard._OldPaths().find_spec("vit.checkpoints") is None
    assert importlib.import_module("vit.checkpoints.io").__file__.startswith(str(VIT))


def test_an_old_path_warns_in_a_fresh_interpreter_at_the_users_line():
    # the finder is installed by `import vit`, and the warning points at the line that named the old path
    code = "from vit.weights import load_pretrained\nprint(load_pretrained.__module__)"
    done = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", code], capture_output=True,
                          text=True, check=True, env=subprocess_env())
    assert done.stdout.strip() == "vit.checkpoints.weights"
    assert "<string>:1: DeprecationWarning: vit.weights moved: import from vit.checkpoints.weights" in done.stderr
    assert ("<string>:1: DeprecationWarning: vit.weights.load_pretrained moved to "
            f"vit.checkpoints.weights.load_pretrained: import it from vit.checkpoints.weights (the old path goes in "
            f"{REMOVED_IN})") in done.stderr
