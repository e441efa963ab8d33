"""Weights a command line names that cannot be had fail before Lightning is imported, and the command line is
read as LightningCLI's parser reads it."""

from __future__ import annotations

import subprocess
import sys

import lightning.pytorch  # noqa: F401  (before capsys: Lightning's log handler keeps the stderr it first sees)
import pytest
import timm
import yaml

from tests import CONFIGS
from tests.conftest import free_port, subprocess_env
from tests.formats import write_hf_cache
from vit.cli.preflight import check_pretrained, configured_pretrained
from vit.commands import main
from vit.errors import UserPathError, WeightsUnavailableError

FOLDER_CPU = str(CONFIGS / "finetune" / "folder_cpu.yaml")
TIMM_NAME = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"  # folder_cpu.yaml's weights


def parsed_pretrained(args: list[str], capsys) -> str | None:
    """``model.init_args.pretrained`` as LightningCLI's own parser reads ``vit fit ARGS`` (its --print_config)."""
    with pytest.raises(SystemExit) as done:
        main(["fit", *args, "--print_config"])
    assert done.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)["model"]["init_args"].get("pretrained") or None


def test_the_command_line_is_read_as_lightning_cli_reads_it(tmp_path, capsys):
    weights = tmp_path / "other.yaml"
    weights.write_text("model:\n  init_args:\n    pretrained: weights/other.safetensors\n")
    data_only = tmp_path / "data.yaml"
    data_only.write_text("data:\n  init_args:\n    batch_size: 4\n")
    cases = [
        ["--config", FOLDER_CPU],
        ["-c", FOLDER_CPU],
        ["--config", FOLDER_CPU, "--model.init_args.pretrained", "null"],
        ["--config", FOLDER_CPU, "--model.init_args.pretrained=~"],
        ["--config", FOLDER_CPU, "--model.init_args.pretrained", "mine.safetensors"],
        ["--config", FOLDER_CPU, "--model.pretrained=mine.pth"],
        ["--config", FOLDER_CPU, "--model.init_args.pretrained", "mine.pth", "--config", str(data_only)],
        ["--config", FOLDER_CPU, "--config", str(weights)],
        [f"--config={FOLDER_CPU}", "--model.init_args.pretrained", "mine.pth", f"--config={weights}"],
        ["--config", str(CONFIGS / "digits.yaml")],  # a recipe without weights
    ]
    # every recipe that names weights: a misreading here would stop a run that can start
    cases += [["--config", str(c)] for c in sorted(CONFIGS.rglob("*.yaml")) if "pretrained:" in c.read_text()]
    for args in cases:
        assert configured_pretrained(args) == parsed_pretrained(args, capsys), args


def test_forms_it_does_not_follow_check_nothing(tmp_path):
    weights = tmp_path / "other.yaml"
    weights.write_text("model:\n  init_args:\n    pretrained: weights/other.safetensors\n")
    resume = tmp_path / "resume.yaml"
    resume.write_text("ckpt_path: run/last.ckpt\n")
    for args in (
        ["--config", FOLDER_CPU, "--ckpt_path", "run/last.ckpt"],  # the checkpoint holds the weights
        ["--config", FOLDER_CPU, "--config", str(resume)],
        ["--config", str(weights), "--config", FOLDER_CPU],  # init_args before a class: LightningCLI refuses it
        ["--model.init_args.pretrained", "mine.pth", "--config", FOLDER_CPU],
        ["--config", FOLDER_CPU, "--model", "model.yaml"],
        ["--config", FOLDER_CPU, "--help"],
        ["--config", FOLDER_CPU, "--print_config=skip_null"],
        ["--config", str(tmp_path / "missing.yaml")],  # LightningCLI names the file
        ["--config", str(CONFIGS / "pretrain" / "mae_digits.yaml")],  # another task
    ):
        assert configured_pretrained(args) is None, args
        check_pretrained(args)  # no error


@pytest.fixture
def unreachable_hub(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    return tmp_path / "hub"


def test_weights_that_can_be_had_pass(unreachable_hub, tmp_path):
    weights = tmp_path / "mine.safetensors"
    state_dict = timm.create_model("vit_tiny_patch16_224").state_dict()
    write_hf_cache(unreachable_hub, f"timm/{TIMM_NAME}", "model.safetensors", state_dict)
    check_pretrained(["--config", FOLDER_CPU])  # in the cache: the hub is not needed
    weights.write_bytes(b"")  # a file that exists (whether it loads is load_pretrained's business)
    check_pretrained(["--config", FOLDER_CPU, "--model.init_args.pretrained", str(weights)])
    check_pretrained(["--config", FOLDER_CPU, "--model.init_args.pretrained", "null"])


def test_weights_that_cannot_be_had_are_named(unreachable_hub, tmp_path):
    with pytest.raises(WeightsUnavailableError, match=f"{TIMM_NAME}'?: not in the cache, and the hub at .* is "
                                                      "unreachable") as err:
        check_pretrained(["--config", FOLDER_CPU])
    assert "Three ways on" in str(err.value)
    with pytest.raises(UserPathError, match=r"checkpoint file not found: weights/mine\.safetensors"):
        check_pretrained(["--config", FOLDER_CPU, "--model.init_args.pretrained", "weights/mine.safetensors"])
    (tmp_path / "empty").mkdir()  # a hub folder (as `vit export` writes one) without its weights file
    with pytest.raises(UserPathError, match=r"a folder without model\.safetensors or pytorch_model\.bin"):
        check_pretrained(["--config", FOLDER_CPU, "--model.init_args.pretrained", str(tmp_path / "empty")])


def test_the_command_fails_before_importing_lightning(tmp_path):
    """The point of the check: the seconds `import lightning` takes (12-20 s on 2 cores) are not spent on a run
    that cannot start. Each command's error, and whether Lightning was imported, from a fresh process."""
    (tmp_path / "photos" / "a").mkdir(parents=True)
    code = (
        "import sys\nfrom vit.commands import main\n"
        f"for argv in ({['probe', '--config', FOLDER_CPU, '--data.init_args.root', 'photos']!r},\n"
        f"             {['fit', '--config', FOLDER_CPU, '--model.init_args.pretrained', 'gone.safetensors']!r}):\n"
        "    try:\n        main(argv)\n    except SystemExit as e:\n"
        "        print('exit', e.code, 'lightning imported:', 'lightning' in sys.modules)\n"
    )
    env = subprocess_env(HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="0",
                         HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.splitlines() == ["exit 1 lightning imported: False"] * 2, done.stdout + done.stderr
    assert f"vit probe: error: cannot load pretrained weights '{TIMM_NAME}'" in done.stderr
    assert "vit fit: error: checkpoint file not found: gone.safetensors" in done.stderr
