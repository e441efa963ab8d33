"""A user's first mistakes get a few lines naming the cause and the fix, not a traceback; bugs keep theirs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch  # noqa: F401  (before capsys: Lightning's log handler keeps the stderr it first sees)
import pytest
from PIL import Image

from tests.conftest import DIGITS, free_port, subprocess_env
from tests.helpers import TINY_DIM
from vit.commands import main
from vit.errors import UserError

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
    # One mistake at a time: the recipe's pretrained weights are not in the tests' cache (they would be named first)
    no_weights = ["--model.init_args.pretrained", "null"]
    err = user_error(["fit", "--config", FOLDER_CPU, "--trainer.max_epocs", "3", *no_weights], capsys)
    assert "did you mean '--trainer.max_epochs'?" in err
    err = user_error(["fit", "--config", FOLDER_CPU, "--model.class_path", "vit.tasks.ImageClassifer"], capsys)
    assert "did you mean 'ImageClassifier'?" in err
    err = user_error(["fit", "--config", FOLDER_CPU, "--trainer.max_epochs", "many", *no_weights], capsys)
    assert "trainer.max_epochs" in err and "'many'" in err and "int" in err
    for command in ("probe", "audit"):  # their config goes through the same parser, under their own name
        err = user_error([command, "--config", str(config), "--data.init_args.root", str(photos), *no_weights],
                         capsys)
        assert "did you mean 'batch_size'?" in err and f"`vit {command} --help`" in err


def test_a_value_a_constructor_refuses_is_its_message(photos, capsys):
    err = user_error(["fit", "--config", FOLDER_CPU, "--data.init_args.root", str(photos),
                      "--model.init_args.model", "vit_nope", "--model.init_args.pretrained", "null"], capsys)
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
    assert "vit fit --config configs/scratch_small.yaml" in err  # the recipe that learns without weights


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


def test_our_warnings_are_a_line_naming_the_command(tmp_path):
    """Python's default format would add the file, line and source line of the `warnings.warn` call. From a
    fresh process: pytest records warnings instead of printing them."""
    done = subprocess.run([sys.executable, "-m", "vit", "predict", "--precision", "bf16", "--ckpt", "missing.ckpt",
                           "photo.png"], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                          timeout=120)
    lines = done.stderr.splitlines()
    assert lines[0].startswith("vit predict: warning: --precision bf16 is deprecated: --backend torch-bf16"), lines
    assert lines[1].startswith("vit predict: error: checkpoint not found: missing.ckpt"), lines
    assert "warnings.warn" not in done.stderr and ".py:" not in done.stderr


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


# ---- a user's own folder (issue 24, §5) ------------------------------------------------------------------------
SCRATCH = str(ROOT / "configs" / "scratch_small.yaml")


def test_a_one_class_folder_says_a_classifier_needs_two(tmp_path, monkeypatch, capsys):
    from tests.formats import write_class_folders

    monkeypatch.chdir(tmp_path)
    write_class_folders(tmp_path / "cats", ["tabby"], per_class=6)
    for command in ("fit", "probe", "audit"):  # one message from where the folder is read, for all three
        err = user_error([command, "--config", SCRATCH, "--data.init_args.root", "cats"], capsys)
        assert "a classifier needs at least two classes; cats has one: tabby" in err, command
        assert "num_classes" not in err  # not torchmetrics' word for it


def truncated_jpeg(path: Path) -> Path:
    """A JPEG with a whole header whose pixel data stops half way: only decoding finds it."""
    from tests.formats import random_rgb

    random_rgb(size=64, seed=9).save(path, quality=95)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


@pytest.mark.parametrize("workers", [0, 2])  # a worker's error arrives wrapped in its traceback's text
def test_a_jpeg_that_fails_only_when_decoded_names_the_options_and_vit_audit(photos, workers, capsys):
    truncated_jpeg(photos / "a" / "0.jpg")
    argv = ["fit", "--config", SCRATCH, "--data.init_args.root", str(photos), "--data.init_args.val_fraction", "0.2",
            "--data.init_args.test_fraction", "0", "--data.init_args.num_workers", str(workers),
            "--model.init_args.model_kwargs", f"{{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2}}",
            "--trainer.max_epochs", "1",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    err = user_error(argv, capsys)
    assert "0.jpg" in err and "image file is truncated" in err and "data.skip_bad_images: true" in err
    assert "max_bad_fraction" in err and "vit audit" in err
    assert "Original Traceback" not in err and 'File "' not in err


def test_on_a_small_folder_one_undecodable_file_is_tolerated_and_two_are_named(tmp_path):
    from vit.data.files import ImageFiles

    good = [(str(tmp_path / f"{i}.png"), 0) for i in range(18)]
    for path, _ in good:
        Image.new("RGB", (8, 8)).save(path)
    bad = [(str(truncated_jpeg(tmp_path / f"bad{i}.jpg")), 0) for i in range(2)]
    samples = [bad[0], *good[:9], bad[1], *good[9:]]  # each bad file followed by a good one of its class
    dataset = ImageFiles(samples, replace_bad=True, max_bad_fraction=0.01)  # 1% of 20 files is 0.2 files
    assert dataset.tolerated() == 1
    dataset[0]  # one bad file of 20: replaced, training goes on
    assert dataset.replacements() == (1, [bad[0][0]])
    with pytest.raises(UserError) as raised:
        dataset[10]
    message = str(raised.value)
    assert "2 of 20 images could not be decoded" in message and "tolerates here (1 of 20)" in message
    assert "data.max_bad_fraction" in message and "vit audit" in message


def test_a_missing_checkpoint_lists_the_checkpoints_that_exist(fitted, capsys):
    ckpts = fitted / "ckpt"
    written = sorted(p.name for p in ckpts.glob("*.ckpt"))
    assert "last.ckpt" in written and any(n.startswith("best-epoch=") for n in written)
    missing = str(ckpts / "best.ckpt")  # the name the README's examples once used; never written
    for argv in (["test", "--config", DIGITS, f"--checkpoint.dirpath={ckpts}", "--ckpt_path", missing],
                 ["predict", "--ckpt", missing, str(fitted)], ["attention", "--ckpt", missing, str(fitted)],
                 ["export", "--ckpt", missing, "--format", "ckpt", "--out", str(fitted / "x")]):
        err = user_error(argv, capsys)
        assert f"checkpoint not found: {missing}" in err, argv
        assert all(name in err for name in written), err


def test_a_misspelt_yaml_key_names_the_file_the_subcommand_and_the_nearest_key(photos, tmp_path, capsys):
    recipe = Path(SCRATCH).read_text()
    for wrong, right in (("max_epochs:", "trainer.max_epochs"), ("seed_everything:", "seed_everything")):
        config = tmp_path / "mine.yaml"
        config.write_text(recipe.replace(wrong, wrong[:-2] + ":", 1))  # max_epoch:, seed_everythin:
        err = user_error(["fit", "--config", str(config), "--data.init_args.root", str(photos)], capsys)
        assert err.startswith(f"vit fit: error: {config}: no option '{right[:-1]}'"), err
        assert f"did you mean '{right}'?" in err and "`vit fit --help`" in err


def test_a_config_with_an_old_key_is_told_the_new_one(tmp_path, capsys):
    """0.1's flat ImageClassifier arguments moved (into optim, the head, DistilledClassifier): a YAML file or a command
    line that gives one is told where it lives now, with every other such key of the file at once."""
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  init_args:\n    lr: 0.004\n    warmup_epochs: 3\n    label_smoothing: 0.1\n"
                   "    teacher: best\n")
    err = user_error(["fit", "--config", DIGITS, "--config", str(old)], capsys)
    assert f"vit fit: error: {old}: vit.tasks.ImageClassifier takes these options elsewhere now:" in err
    assert "model.init_args.{lr, warmup_epochs} moved: use model.init_args.optim.{lr, warmup_epochs}" in err
    assert "model.init_args.label_smoothing moved: use model.init_args.head.init_args.label_smoothing" in err
    assert "model.init_args.teacher: options of model.class_path = vit.tasks.DistilledClassifier" in err
    err = user_error(["fit", "--config", DIGITS, "--model.init_args.ema_decay", "0.9"], capsys)
    assert "model.init_args.ema_decay moved: use model.init_args.optim.ema_decay" in err
    err = user_error(["fit", "--config", DIGITS, "--model", "vit.tasks.ConvNetClassifier", "--model.init_args.lr",
                      "0.1"], capsys)  # 0.1's convnet classifier, kept for a release, is told the same
    assert "model.init_args.lr moved: use model.init_args.optim.lr" in err


def test_a_0_1_checkpoint_as_ckpt_path_says_what_reads_it(capsys):
    """LightningCLI reads --ckpt_path's hyperparameters into the config, and 0.1's flat ones are no option now: the
    error says what reads the file (tests/deploy/test_classifier.py reads it so) instead of a jsonargparse dump."""
    old = str(ROOT / "tests" / "deploy" / "data" / "vit_0.1_digits.ckpt")
    err = user_error(["test", "--config", DIGITS, "--ckpt_path", old], capsys)
    assert f"--ckpt_path {old} was written by vit 0.1, whose classifier took lr, " in err
    assert "vit predict --ckpt" in err and f"--model.init_args.pretrained {old}" in err


def test_a_misspelt_key_in_optim_or_the_head_suggests_the_nearest(tmp_path, capsys):
    err = user_error(["fit", "--config", DIGITS, "--model.init_args.optim.warmup_epoch", "2"], capsys)
    assert "has no option 'optim.warmup_epoch' (did you mean 'optim.warmup_epochs'?)" in err
    typo = tmp_path / "typo.yaml"
    typo.write_text("model:\n  init_args:\n    head:\n      init_args:\n        label_smothing: 0.2\n")
    err = user_error(["fit", "--config", DIGITS, "--config", str(typo)], capsys)
    assert ("model.init_args.head: vit.tasks.SingleLabelHead has no option 'label_smothing' (did you mean "
            "'label_smoothing'?)") in err


def test_an_option_that_is_a_prefix_of_another_is_not_taken_for_it(photos, capsys):
    """argparse would silently read --trainer.max_epoch as --trainer.max_epochs (allow_abbrev)."""
    err = user_error(["fit", "--config", SCRATCH, "--data.init_args.root", str(photos), "--trainer.max_epoch", "3"],
                     capsys)
    assert "--trainer.max_epoch" in err and "did you mean '--trainer.max_epochs'?" in err
    for command in ("probe", "audit"):  # the same parser
        err = user_error([command, "--config", SCRATCH, "--data.init_args.root", str(photos),
                          "--data.init_args.img_siz", "16"], capsys)
        assert "did you mean 'img_size'?" in err


def test_an_image_passed_as_the_checkpoint_is_called_an_image(photos, capsys):
    image = str(photos / "a" / "photo.jpg")
    Image.new("RGB", (40, 30), "tan").save(image)
    for argv in (["predict", "--ckpt", image, str(photos)], ["attention", "--ckpt", image, str(photos)],
                 ["export", "--ckpt", image, "--format", "ckpt", "--out", "x"],
                 ["test", "--config", SCRATCH, "--data.init_args.root", str(photos), "--ckpt_path", image]):
        err = user_error(argv, capsys)
        assert "this is an image, not a checkpoint" in err and "JPEG" in err and "damaged" not in err, argv


def test_pretrained_null_on_a_fine_tuning_recipe_points_to_the_scratch_recipe(photos, capsys):
    with pytest.warns(UserWarning, match=r"fine-tuning recipe.*configs/scratch_small\.yaml"):
        main(["fit", "--config", FOLDER_CPU, "--data.init_args.root", str(photos), "--model.init_args.pretrained",
              "null", "--model.init_args.model_kwargs", "{depth: 1}", "--data.init_args.img_size", "32",
              "--trainer.max_steps", "1", "--trainer.limit_val_batches", "1", "--test_after_fit", "false",
              "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"])
