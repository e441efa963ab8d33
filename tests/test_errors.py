"""A user's first mistakes get a few lines naming the cause and the fix, not a traceback; bugs keep theirs."""

from __future__ import annotations

import time
from pathlib import Path

import lightning.pytorch  # noqa: F401  (before capsys: Lightning's log handler keeps the stderr it first sees)
import pytest

from tests.conftest import free_port
from vit.commands import main

ROOT = Path(__file__).resolve().parents[1]
FOLDER_CPU = str(ROOT / "configs" / "finetune" / "folder_cpu.yaml")


def user_error(argv: list[str], capsys) -> str:
    """Run the console script on ``argv``; it must exit 1 with a short message and no traceback."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code in (1, 2), err
    lines = [line for line in err.splitlines() if line.strip()]
    assert any(line.startswith(f"vit {argv[0]}: error: ") for line in lines), err
    assert len(lines) <= 10 and "Traceback" not in err, err
    return err


@pytest.fixture
def photos(tmp_path, monkeypatch) -> Path:
    from tests.formats import write_class_folders

    monkeypatch.chdir(tmp_path)
    write_class_folders(tmp_path / "photos", ["a", "b"], per_class=10)
    return tmp_path / "photos"


def test_a_missing_data_folder_is_named(photos, capsys):
    err = user_error(["fit", "--config", FOLDER_CPU, "--data.init_args.root", "photoz",
                      "--model.init_args.pretrained", "null"], capsys)
    assert "image folder not found: photoz" in err


def test_a_misspelt_key_suggests_the_nearest(photos, tmp_path, capsys):
    config = tmp_path / "misspelt.yaml"
    config.write_text(Path(FOLDER_CPU).read_text().replace("batch_size:", "batch_sise:"))
    err = user_error(["fit", "--config", str(config), "--data.init_args.root", str(photos),
                      "--model.init_args.pretrained", "null"], capsys)
    assert "'batch_sise'" in err and "did you mean 'batch_size'?" in err
    err = user_error(["fit", "--config", FOLDER_CPU, "--trainer.max_epocs", "3"], capsys)
    assert "did you mean '--trainer.max_epochs'?" in err
    err = user_error(["fit", "--config", FOLDER_CPU, "--model.class_path", "vit.tasks.ImageClassifer"], capsys)
    assert "did you mean 'ImageClassifier'?" in err
    err = user_error(["fit", "--config", FOLDER_CPU, "--trainer.max_epochs", "many"], capsys)
    assert "trainer.max_epochs" in err and "'many'" in err and "int" in err
    for command in ("probe", "audit"):  # their config goes through the same parser, under their own name
        err = user_error([command, "--config", str(config), "--data.init_args.root", str(photos)], capsys)
        assert "did you mean 'batch_size'?" in err and f"`vit {command} --help`" in err


def test_a_value_a_constructor_refuses_is_its_message(photos, capsys):
    err = user_error(["fit", "--config", FOLDER_CPU, "--data.init_args.root", str(photos),
                      "--model.init_args.model", "vit_nope"], capsys)
    assert "unknown model 'vit_nope'" in err


def test_pretrained_weights_with_the_hub_unreachable_fail_fast(photos, tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    start = time.perf_counter()
    err = user_error(["probe", "--config", FOLDER_CPU, "--data.init_args.root", str(photos)], capsys)
    assert time.perf_counter() - start < 15
    assert "vit_tiny_patch16_224.augreg_in21k_ft_in1k" in err and "unreachable" in err
    assert "HF_HUB_OFFLINE=1" in err and "path/to/model.safetensors" in err and "pretrained null" in err


def test_trainer_settings_this_machine_cannot_run_are_named(photos, capsys):
    """A GPU recipe on a machine without that accelerator (mps: never on Linux, so it fails on any CI)."""
    recipe = str(ROOT / "configs" / "finetune" / "folder_vit_small.yaml")
    err = user_error(["fit", "--config", recipe, "--data.init_args.root", str(photos),
                      "--model.init_args.pretrained", "null", "--trainer.accelerator", "mps"], capsys)
    assert "accelerator: mps" in err and "precision: bf16-mixed" in err and "--trainer.accelerator cpu" in err


def test_a_damaged_checkpoint_is_named(photos, tmp_path, capsys):
    damaged = tmp_path / "damaged.ckpt"
    damaged.write_bytes(b"PK\x03\x04 not a whole checkpoint")
    err = user_error(["predict", "--ckpt", str(damaged), str(photos)], capsys)
    assert f"checkpoint {damaged} is damaged" in err


def test_traceback_flag_shows_the_traceback_and_bugs_keep_theirs(photos, monkeypatch, capsys):
    monkeypatch.delenv("VIT_TRACEBACK", raising=False)
    with pytest.raises(FileNotFoundError, match="photoz"):  # the exception itself, for a bug report
        main(["fit", "--config", FOLDER_CPU, "--data.init_args.root", "photoz", "--model.init_args.pretrained",
              "null", "--traceback"])
    # Not a user error: a bug in our code is never turned into a short message.
    import vit.commands.export

    def broken(argv):
        raise KeyError("a bug")

    monkeypatch.setattr(vit.commands.export, "main", broken)
    with pytest.raises(KeyError, match="a bug"):
        main(["export", "--ckpt", "x.ckpt"])
