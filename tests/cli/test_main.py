"""The `vit` CLI in-process: fit (+ test of the best checkpoint), validate, test, predict, loggers, resume."""

from __future__ import annotations

import csv
import os
import re
import shutil
import socket
import subprocess

import pytest
import torch

from tests import CONFIGS
from tests.conftest import DIGITS, free_port, subprocess_env
from tests.conftest import short_digits_run as short_run
from tests.formats import write_class_folders
from tests.helpers import TINY_DIM
from vit.cli.main import cli
from vit.commands import main
from vit.deploy import load_classifier

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


def test_fit_tests_best_checkpoint_saves_config_and_reruns(fitted, tmp_path, capsys):
    run = fitted / "logs" / "digits" / "version_0"
    assert (run / "config.yaml").is_file() and (run / "metrics.csv").is_file()
    assert (run / "confusion_matrix.png").is_file()  # from the test after fit
    assert "test_after_fit: true" in (run / "config.yaml").read_text()
    best = sorted((fitted / "ckpt").glob("best-*.ckpt"))
    assert best and (fitted / "ckpt" / "last.ckpt").is_file()
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train_loss", "val_acc", "test_acc", "lr-AdamW/decay", "lr-AdamW/no_decay"} <= set(header)

    # a second run into the same folders neither fails nor overwrites the first (in a copy: `fitted` is shared, and
    # a second best-*.ckpt in it would change what other tests find there)
    again = shutil.copytree(fitted, tmp_path / "again")
    main(["fit", *short_run(again, steps=2)])
    out = capsys.readouterr().out
    assert "test accuracy of" in out and "best-" in out
    assert (again / "logs" / "digits" / "version_1" / "config.yaml").is_file()
    assert (again / "logs" / "digits" / "version_0" / "config.yaml").read_bytes() == (run / "config.yaml").read_bytes()


def test_validate_and_test_report_the_checkpoint_accuracy(fitted):
    best = str(sorted((fitted / "ckpt").glob("best-*.ckpt"))[0])
    run = cli(["test", *short_run(fitted), "--ckpt_path", best, "--trainer.limit_test_batches=1.0"])
    reported = run.trainer.callback_metrics["test_acc"].item()
    # the same accuracy, computed by hand from the checkpoint alone
    classifier = load_classifier(best)
    data = run.datamodule
    x = torch.stack([data.test_set[i][0] for i in range(len(data.test_set))])
    y = data.test_set.labels
    with torch.no_grad():
        acc = (classifier(x).argmax(-1) == y).float().mean().item()
    assert reported == pytest.approx(acc, abs=1e-6)

    run = cli(["validate", *short_run(fitted), "--ckpt_path", best, "--trainer.limit_val_batches=1.0"])
    data = run.datamodule
    x = torch.stack([data.val_set[i][0] for i in range(len(data.val_set))])
    with torch.no_grad():
        acc = (classifier(x).argmax(-1) == data.val_set.labels).float().mean().item()
    assert run.trainer.callback_metrics["val_acc"].item() == pytest.approx(acc, abs=1e-6)


def test_lightning_predict_on_the_datamodule(fitted):
    best = str(sorted((fitted / "ckpt").glob("best-*.ckpt"))[0])
    run = cli(["predict", *short_run(fitted), "--ckpt_path", best, "--trainer.limit_predict_batches=2"])
    assert run.trainer.predict_loop.predictions  # probabilities per batch
    probs = run.trainer.predict_loop.predictions[0]
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(probs)))


@pytest.mark.slow
def test_resume_with_ckpt_path_last_continues_from_the_saved_step(tmp_path):
    # 3 epochs of 3 steps; last.ckpt is written at each epoch end; the run dies in epoch 2. With a max_steps the
    # epochs reach first, as the recipes' step budgets: Lightning (2.6) then reran epoch 0's end on the resume,
    # counted it twice and trained 6 steps, not 9 (`vit.cli.training.EpochEndResume`); without one it did not.
    args = [*short_run(tmp_path, steps=3), "--trainer.max_epochs=3", "--trainer.max_steps=100",
            "--test_after_fit=false"]
    crash = ["--trainer.callbacks+=tests.dummies.CrashAtStep", "--trainer.callbacks.init_args.step=5"]
    with pytest.raises(RuntimeError, match="simulated crash at step 5"):
        main(["fit", *args, *crash])
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 3 and saved["epoch"] == 0

    run = cli(["fit", *args, "--ckpt_path", "last"])
    assert run.trainer.global_step == 9 and run.trainer.current_epoch == 3
    rows = list(csv.DictReader((tmp_path / "logs" / "digits" / "version_1" / "metrics.csv").open()))
    steps = [int(r["step"]) for r in rows if r["step"]]
    assert min(steps) >= 3 and max(steps) == 8  # the resumed run logs only steps after the checkpoint
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["global_step"] == 9

    with pytest.raises(FileNotFoundError, match="no last"):
        cli(["fit", *short_run(tmp_path / "fresh"), "--ckpt_path", "last"])


def test_fit_resumes_from_the_best_checkpoint_with_ckpt_path_best(tmp_path, capsys):
    """`vit fit --ckpt_path best` was a traceback from Lightning ("ModelCheckpoint is not configured to save the
    best model"): a new process knows no best. It now resumes the run's best checkpoint, and says so."""
    from vit.checkpoints.io import checkpoint_progress

    args = [*short_run(tmp_path, steps=3), "--test_after_fit=false"]
    main(["fit", *args, "--trainer.max_epochs=2"])
    (best,) = (tmp_path / "ckpt").glob("best-*.ckpt")
    epoch, step = checkpoint_progress(best)
    run = cli(["fit", *args, "--trainer.max_epochs=3", "--ckpt_path", "best"])
    assert run.trainer.ckpt_path == str(best) and run.trainer.global_step == 9
    assert f"--ckpt_path best: resuming from {best} (epoch {epoch}, step {step})" in capsys.readouterr().out


def test_best_and_last_are_found_in_the_run_folders_lightning_names_without_checkpoint_dirpath(tmp_path):
    """A config without checkpoint.dirpath keeps each run's checkpoints in logs/digits/version_N/checkpoints, as
    Lightning names them: `--ckpt_path last` resumed nothing ("no last*.ckpt in None, None") and `--ckpt_path
    best` looked in logs/digits/checkpoints. Both now read the newest run's folder."""
    args = [*short_run(tmp_path, steps=3), "--checkpoint.dirpath=null", "--trainer.max_epochs=2",
            "--test_after_fit=false"]
    with pytest.raises(RuntimeError, match="simulated crash at step 4"):
        main(["fit", *args, "--trainer.callbacks+=tests.dummies.CrashAtStep", "--trainer.callbacks.init_args.step=4"])
    first = tmp_path / "logs" / "digits" / "version_0" / "checkpoints"
    assert torch.load(first / "last.ckpt", weights_only=True)["global_step"] == 3
    resumed = cli(["fit", *args, "--ckpt_path", "last"])
    assert resumed.trainer.ckpt_path == str(first / "last.ckpt") and resumed.trainer.global_step == 6
    second = tmp_path / "logs" / "digits" / "version_1" / "checkpoints"
    (best,) = second.glob("best-*.ckpt")  # the resumed run's, validated after epoch 2 (epoch 1's is in version_0)
    tested = cli(["test", *short_run(tmp_path), "--checkpoint.dirpath=null", "--ckpt_path", "best"])
    assert tested.trainer.ckpt_path == str(best)
    with pytest.raises(FileNotFoundError, match=r"no last checkpoint in .*fresh/logs/digits/<version>/checkpoints"):
        cli(["fit", *short_run(tmp_path / "fresh"), "--checkpoint.dirpath=null", "--ckpt_path", "last"])


@pytest.mark.slow
def test_wandb_logger_offline_writes_its_run_and_no_network(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    real_connect = socket.socket.connect

    def local_only(sock, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(address, tuple) and host not in ("127.0.0.1", "localhost", "::1"):
            raise AssertionError(f"network access to {address}")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)
    args = short_run(tmp_path, "--config", str(CONFIGS / "loggers" / "wandb.yaml"), steps=2)
    main(["fit", *args, "--test_after_fit=false"])
    runs = list((tmp_path / "logs" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))


def test_print_config_and_links_from_an_image_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", DIGITS, "--print_config"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    assert "class_path: vit.data.Digits" in printed and "test_after_fit: true" in printed

    root = tmp_path / "shapes"
    write_class_folders(root, ["circle", "square", "star"], per_class=4, size=16)
    run = cli([
        "fit", "--data=vit.data.ImageFolder", f"--data.root={root}", "--data.img_size=16",
        "--data.num_workers=0", "--data.batch_size=4", "--data.val_fraction=0.25",
        "--model=vit.tasks.ImageClassifier", "--model.model=vit_tiny_patch16_224",
        "--model.model_kwargs={depth: 1, patch_size: 8}",
        f"--trainer.default_root_dir={tmp_path}", "--trainer.max_epochs=1", "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--seed_everything=0",
    ])
    model = run.model
    assert model.model.head.out_features == 3 and model.class_names == ["circle", "square", "star"]
    assert model.model.img_size == (16, 16) and model.model.in_chans == 3 and model.crop_pct == 0.875


def test_another_model_class_keeps_its_own_defaults(tmp_path, capsys):
    """No classifier defaults (lr, weight decay, betas) leak into a model chosen by class_path."""
    config = tmp_path / "translate.yaml"
    config.write_text(
        "model:\n  class_path: vit.tasks.Translator\n"
        "data:\n  class_path: vit.data.SyntheticTranslationDataModule\n"
    )
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--print_config"])
    printed = capsys.readouterr().out
    model = printed[printed.index("model:"):printed.index("data:")]
    assert "lr: null" in model and "weight_decay: 0.0" in model and "- 0.98" in model


def test_links_are_skipped_when_model_or_data_lacks_the_name(tmp_path):
    common = [f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=1", "--trainer.log_every_n_steps=1",
              "--checkpoint.monitor=null",
              "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    # the model lacks num_classes etc.: only `mean` is linked from the digits
    run = cli(["fit", "--model=tests.dummies.NoClassesModel", "--data=vit.data.Digits", *common])
    assert tuple(run.model.mean) == run.datamodule.mean
    # the datamodule lacks every linked attribute: the model keeps its own defaults
    run = cli(["fit", "--model=vit.tasks.ImageClassifier", "--data=tests.dummies.BareData", *common,
               "--model.model_kwargs={depth: 1, embed_dim: 16, num_heads: 2, in_chans: 4, img_size: 1, "
               "patch_size: 1}"])
    assert run.model.model.num_classes == 10


@pytest.mark.slow
def test_digits_recipe_learns_and_its_test_accuracy_is_logged(digits_run):
    """A short real run of the digits recipe (15 epochs): the test accuracy in metrics.csv clears 0.9."""
    assert digits_run.metric("test_acc") >= 0.9
    assert digits_run.metric("val_acc") >= 0.85


def test_tensorboard_logger_config_writes_events(tmp_path):
    args = short_run(tmp_path, "--config", str(CONFIGS / "loggers" / "tensorboard.yaml"), steps=2)
    main(["fit", *args, "--test_after_fit=false"])
    runs = list((tmp_path / "logs").rglob("events.out.tfevents.*"))
    assert runs and (runs[0].parent / "config.yaml").is_file()


@pytest.mark.processes
@pytest.mark.slow
def test_ddp_on_two_cpu_processes_with_ema_through_the_unfreeze(tmp_path):
    """The DDP path (gloo on CPU) with EMA and a staged fine-tune: two ranks train the head alone for an epoch, then
    the whole network, validate (EMA weights, synced metrics) and save. (One 2-process run for both: each costs
    two start-ups.)

    The model trains 192 steps, so it is well above chance (a model at chance scores about the same whatever
    its weights), and validation stops after 2 of each rank's 3 batches, so the images seen are a subset
    that only the right shares, limit and sync add up to.
    """
    import sys

    epochs, steps, batch, val_batches = 12, 16, 32, 2
    cmd = [sys.executable, "-m", "vit", "fit", *short_run(tmp_path, steps=steps),
           "--trainer.strategy=ddp_find_unused_parameters_true", "--trainer.devices=2",
           "--model.init_args.finetune=vit.tasks.finetune.Staged",
           "--model.init_args.finetune.init_args.head_epochs=1", f"--trainer.max_epochs={epochs}",
           f"--trainer.check_val_every_n_epoch={epochs}", f"--trainer.limit_val_batches={val_batches}",
           f"--data.init_args.batch_size={batch}", "--model.init_args.optim.warmup_epochs=0", "--test_after_fit=false",
           "--trainer.callbacks+=tests.dummies.RecordWorldSize", "--trainer.callbacks+=tests.dummies.RecordBackbone"]
    port = free_port()
    env = subprocess_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted((tmp_path / "world_size").read_text().split()) == ["0/2", "1/2"]
    per_rank = {}  # every rank: the backbone unchanged by the head-only epoch, then trained, the same on both
    for line in (tmp_path / "backbone").read_text().split():
        rank, epoch, value = line.split(":")
        per_rank.setdefault(rank, {})[int(epoch)] = float(value)
    assert per_rank["0"] == per_rank["1"]
    assert per_rank["0"][-1] == per_rank["0"][0] != per_rank["0"][1]  # start, head-only epoch 0, epoch 1
    rows = list(csv.DictReader((tmp_path / "logs" / "digits" / "version_0" / "metrics.csv").open()))
    val_acc = [float(r["val_acc"]) for r in rows if r.get("val_acc")]
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == epochs * steps and any(k.startswith("model_ema.") for k in saved["state_dict"])
    # The synced val_acc, recomputed in one process: each rank's first 2 batches of its DistributedSampler
    # share, scored with the EMA weights the checkpoint kept (validation ran after the last step).
    import yaml
    from torch.utils.data import DistributedSampler

    from vit.data.digits import Digits

    config = yaml.safe_load((tmp_path / "logs" / "digits" / "version_0" / "config.yaml").read_text())
    data = Digits(**config["data"]["init_args"])  # val is not augmented
    data.setup("validate")
    model = load_classifier(tmp_path / "ckpt" / "last.ckpt").eval()
    shares = [list(DistributedSampler(data.val_set, 2, rank, shuffle=False)) for rank in (0, 1)]
    assert all(len(share) > val_batches * batch for share in shares)  # the limit leaves batches out

    def accuracy(indices: list[int]) -> float:
        x = torch.stack([data.val_set[i][0] for i in indices])
        y = torch.tensor([int(data.val_set[i][1]) for i in indices])
        with torch.no_grad():
            return (model(x).argmax(1) == y).float().mean().item()

    seen = [share[: val_batches * batch] for share in shares]
    expected = accuracy(seen[0] + seen[1])
    assert expected > 0.3  # 10 classes: well above chance
    assert accuracy(seen[0]) != expected  # so rank 0's own figure, unsynced, would not pass
    assert len(val_acc) == 1 and val_acc[0] == pytest.approx(expected, abs=1e-6)


@pytest.mark.slow
@pytest.mark.network  # pip installs lightning: not in the default run; .ci/run runs it on its own
def test_cli_runs_on_the_lowest_lightning_we_declare(tmp_path):
    """pyproject.toml's lower bound for lightning is tested, not hoped for: install exactly that version
    beside this environment and run a fit, a resume from last.ckpt and a test through `vit`."""
    import sys

    declared = (CONFIGS.parent / "pyproject.toml").read_text()
    lowest = re.search(r'"lightning>=([\d.]+)', declared).group(1)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    f"lightning=={lowest}"], check=True, timeout=300)
    env = subprocess_env(PYTHONPATH=os.pathsep.join([str(target), str(CONFIGS.parent)]))
    version = subprocess.run([sys.executable, "-c", "import lightning; print(lightning.__version__)"], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version == lowest
    args = [*short_run(tmp_path / "run", steps=3), "--trainer.max_epochs=2"]
    for extra in (["--trainer.max_epochs=1"], ["--ckpt_path", "last"]):
        done = subprocess.run([sys.executable, "-m", "vit", "fit", *args, *extra], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    assert "test accuracy of" in done.stdout
    assert torch.load(tmp_path / "run" / "ckpt" / "last.ckpt", weights_only=False)["global_step"] == 6


@pytest.mark.slow
def test_vit_fit_prints_what_a_user_needs_and_no_dependency_noise(tmp_path):
    """The console script as installed (not main() in-process), as a user runs it, progress bar and model summary
    on: a fit that succeeds exits 0, whatever main returns; split sizes, the model in a line (its own parameters,
    not the EMA copy's too), the parameter groups, the results; no Lightning tip, torch deprecation, FLOPs 0,
    v_num or raw Python warning."""
    import shutil

    vit = shutil.which("vit")
    assert vit, "the `vit` console script is not installed (pip install -e .)"
    args = ["fit", "--config", DIGITS, f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.logger.init_args.save_dir={tmp_path}/logs", f"--checkpoint.dirpath={tmp_path}/ckpt",
            "--trainer.max_epochs=1", "--trainer.limit_train_batches=4", "--trainer.log_every_n_steps=1",
            f"--model.init_args.model_kwargs={{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2}}"]
    done = subprocess.run([vit, *args], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=subprocess_env())
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout + done.stderr
    assert "digits: 1259 train, 179 val, 359 test images, 10 classes" in printed
    assert "parameter group" in printed and "test accuracy of" in printed
    for noise in ("Tip:", "LeafSpec", "FLOPs", "Non-trainable params", "v_num", "Warning:", "stepping batches",
                  "weights_only", "args parameter is intended"):  # the last: LightningCLI reads the command line
        assert noise not in printed, noise
    counted = int(re.search(r"model: VisionTransformer \S+, ([\d,]+) parameters", printed).group(1).replace(",", ""))
    state = torch.load(next((tmp_path / "ckpt").glob("best-*.ckpt")), weights_only=False)["state_dict"]
    own = sum(v.numel() for k, v in state.items() if k.startswith("model."))
    assert any(k.startswith("model_ema.") for k in state) and counted == own  # the EMA copy is not counted
    fit_help = subprocess.run([vit, "fit", "--help"], capture_output=True, text=True, check=True).stdout
    assert fit_help.startswith("usage: vit [options] fit")


def test_fit_leaves_training_curves_beside_the_confusion_matrix(fitted):
    run = fitted / "logs" / "digits" / "version_0"
    curves = run / "curves.png"
    assert (run / "confusion_matrix.png").is_file() and curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(curves) as image:
        assert image.width > 2 * image.height  # three panels side by side: loss, val accuracy, lr


def test_the_curves_plot_what_was_logged(tmp_path):
    from vit.cli.training import TrainingCurves

    class Step:  # what the callback reads of a Trainer
        sanity_checking, is_global_zero, log_dir = False, True, str(tmp_path)

        def __init__(self, step, metrics):
            self.global_step, self.callback_metrics = step, {k: torch.tensor(v) for k, v in metrics.items()}
            self.optimizers = [torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1 * step + 0.01)]

    curves = TrainingCurves()
    for step in range(1, 5):
        curves.on_train_batch_start(Step(step - 1, {}), None, None, 0)
        curves.on_train_batch_end(Step(step, {"train_loss": 2.0 / step}), None, None, None, 0)
    curves.on_validation_end(Step(4, {"val_loss": 0.6, "val_acc": 0.8, "val_acc_balanced": 0.7}), None)
    assert curves.train_loss == [(s, pytest.approx(2.0 / s)) for s in range(1, 5)]
    assert curves.lr == [(s, pytest.approx(0.1 * (s - 1) + 0.01)) for s in range(1, 5)]
    assert curves.val == {"val_loss": [(4, pytest.approx(0.6))], "val_acc": [(4, pytest.approx(0.8))],
                          "val_acc_balanced": [(4, pytest.approx(0.7))]}
    curves.on_fit_end(Step(4, {}), None)
    assert (tmp_path / "curves.png").is_file()


def test_vit_version(capsys):
    import lightning

    import vit

    main(["--version"])
    out = capsys.readouterr().out
    assert out.startswith(f"vit {vit.__version__} ") and lightning.__version__ in out
    assert f"torch {torch.__version__.split('+')[0]}" in out  # the wheel's local tag (+cpu, +cu124) aside


@pytest.mark.parametrize(("model", "held", "said"), [
    ("vit.tasks.contrastive.ContrastiveTask", "classify",
     r"holds the ImageClassifier task \('classify'\), but the ContrastiveTask task \('contrastive'\) is needed"),
    ("vit.tasks.ImageClassifier", "contrastive",
     r"holds the ContrastiveTask task \('contrastive'\), but the ImageClassifier task \('classify'\) is needed"),
])
def test_ckpt_path_of_another_task_is_named_for_contrastive_runs_too(tmp_path, model, held, said):
    from vit.cli.ckpt_path import check_checkpoint_task

    path = tmp_path / "other.ckpt"
    torch.save({"vit": {"task": held}, "state_dict": {}}, path)
    with pytest.raises(ValueError, match=rf"--ckpt_path .*other\.ckpt {said}"):
        check_checkpoint_task({"ckpt_path": str(path), "model": {"class_path": model}})
    torch.save({"vit": {"task": "contrastive" if held == "classify" else "classify"}, "state_dict": {}}, path)
    check_checkpoint_task({"ckpt_path": str(path), "model": {"class_path": model}})  # its own task: no error
