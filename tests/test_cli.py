"""The `vit` CLI in-process: fit (+ test of the best checkpoint), validate, test, predict, loggers, resume."""

from __future__ import annotations

import csv
import json
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
from _images import write_class_folders
from PIL import Image

from vit.cli import cli, main
from vit.tasks.classify import load_classifier

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DIGITS = str(CONFIGS / "digits.yaml")


def short_run(tmp: Path, *extra: str, steps: int = 4) -> list[str]:
    """Arguments for a seconds-long digits run that writes only under ``tmp``."""
    return [
        "--config", DIGITS, *extra,
        f"--trainer.default_root_dir={tmp}", f"--trainer.logger.init_args.save_dir={tmp}/logs",
        f"--checkpoint.dirpath={tmp}/ckpt", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--trainer.max_epochs=1", "--trainer.log_every_n_steps=1",
        f"--trainer.limit_train_batches={steps}", "--trainer.limit_val_batches=2",
        "--model.init_args.model_kwargs={depth: 1, embed_dim: 32, num_heads: 2}",
    ]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> Path:
    """One short `vit fit` of the digits recipe, shared by the tests that need a checkpoint."""
    tmp = tmp_path_factory.mktemp("fit")
    main(["fit", *short_run(tmp)])
    return tmp


def test_fit_tests_best_checkpoint_saves_config_and_reruns(fitted, tmp_path, capsys):
    run = fitted / "logs" / "digits" / "version_0"
    assert (run / "config.yaml").is_file() and (run / "metrics.csv").is_file()
    assert (run / "confusion_matrix.png").is_file()  # from the test after fit
    assert "test_after_fit: true" in (run / "config.yaml").read_text()
    best = sorted((fitted / "ckpt").glob("best-*.ckpt"))
    assert best and (fitted / "ckpt" / "last.ckpt").is_file()
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train_loss", "val_acc", "test_acc", "lr-AdamW/decay", "lr-AdamW/no_decay"} <= set(header)

    # a second run into the same folders neither fails nor overwrites the first
    main(["fit", *short_run(fitted, steps=2)])
    out = capsys.readouterr().out
    assert "test accuracy of" in out and "best-" in out
    assert (fitted / "logs" / "digits" / "version_1" / "config.yaml").is_file()


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
    assert 0.0 <= run.trainer.callback_metrics["val_acc"].item() <= 1.0


def test_predict_writes_topk_csv_and_json(fitted, tmp_path, capsys):
    from sklearn.datasets import load_digits

    folder = tmp_path / "images"
    folder.mkdir()
    digits = load_digits()
    for i in range(5):
        pixels = np.clip(digits.images[i] * 16, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"digit{i}.png")
    (folder / "readme.txt").write_text("not an image")
    rgb = folder / "colour.jpg"
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(rgb)  # other size and mode: resized, grey

    best = str(sorted((fitted / "ckpt").glob("best-*.ckpt"))[0])
    out_csv = tmp_path / "preds.csv"
    with pytest.warns(UserWarning, match="skipped 1 files that are not images"):
        main(["predict", "--ckpt", best, str(folder), "--out", str(out_csv), "--top_k", "3"])
    assert "wrote 6 predictions" in capsys.readouterr().out
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 6
    assert list(rows[0]) == ["path", "class_1", "prob_1", "class_2", "prob_2", "class_3", "prob_3"]
    for row in rows:
        probs = [float(row[f"prob_{k}"]) for k in (1, 2, 3)]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
        assert {row[f"class_{k}"] for k in (1, 2, 3)} <= {str(d) for d in range(10)}

    out_json = tmp_path / "preds.json"
    main(["predict", "--ckpt", best, str(folder / "digit0.png"), str(rgb), "--out", str(out_json),
          "--top_k", "10"])
    preds = json.loads(out_json.read_text())
    assert [Path(p["path"]).name for p in preds] == ["digit0.png", "colour.jpg"]
    assert sum(preds[0]["probs"]) == pytest.approx(1.0, abs=1e-4)
    assert preds[0]["classes"][0] == json.loads(out_json.read_text())[0]["classes"][0]
    assert rows[[Path(r["path"]).name for r in rows].index("digit0.png")]["class_1"] == preds[0]["classes"][0]

    with pytest.raises(FileNotFoundError, match="no such image file or folder"):
        main(["predict", "--ckpt", best, str(tmp_path / "missing.png")])


def test_lightning_predict_on_the_datamodule(fitted):
    best = str(sorted((fitted / "ckpt").glob("best-*.ckpt"))[0])
    run = cli(["predict", *short_run(fitted), "--ckpt_path", best, "--trainer.limit_predict_batches=2"])
    assert run.trainer.predict_loop.predictions  # probabilities per batch
    probs = run.trainer.predict_loop.predictions[0]
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(probs)))


def test_resume_with_ckpt_path_last_continues_from_the_saved_step(tmp_path):
    # 3 epochs of 3 steps; last.ckpt is written at each epoch end; the run dies in epoch 2.
    args = [*short_run(tmp_path, steps=3), "--trainer.max_epochs=3", "--test_after_fit=false"]
    crash = ["--trainer.callbacks+=_images.CrashAtStep", "--trainer.callbacks.init_args.step=5"]
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
        main(["fit", *short_run(tmp_path / "fresh"), "--ckpt_path", "last"])


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
        f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=1",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
    ])
    model = run.model
    assert model.model.head.out_features == 3 and model.class_names == ["circle", "square", "star"]
    assert model.img_size == (16, 16) and model.in_chans == 3 and model.crop_pct == 0.875


def test_another_model_class_keeps_its_own_defaults(tmp_path, capsys):
    """No classifier defaults (lr, weight decay, betas) leak into a model chosen by class_path."""
    config = tmp_path / "translate.yaml"
    config.write_text(
        "model:\n  class_path: vit.tasks.translate.Translator\n"
        "data:\n  class_path: vit.data.text.SyntheticTranslationDataModule\n"
    )
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--print_config"])
    printed = capsys.readouterr().out
    model = printed[printed.index("model:"):printed.index("data:")]
    assert "lr: null" in model and "weight_decay: 0.0" in model and "- 0.98" in model


def test_links_are_skipped_when_model_or_data_lacks_the_name(tmp_path):
    common = [f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=1", "--checkpoint.monitor=null",
              "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    # the model lacks num_classes etc.: only `mean` is linked from the digits
    run = cli(["fit", "--model=_dummies.NoClassesModel", "--data=vit.data.Digits", *common])
    assert tuple(run.model.mean) == run.datamodule.mean
    # the datamodule lacks every linked attribute: the model keeps its own defaults
    run = cli(["fit", "--model=vit.tasks.ImageClassifier", "--data=_dummies.BareData", *common,
               "--model.model_kwargs={depth: 1, embed_dim: 16, num_heads: 2, in_chans: 4, img_size: 1, "
               "patch_size: 1}"])
    assert run.model.model.num_classes == 10


@pytest.mark.parametrize("recipe", ["cifar10_vit", "cifar100_vit", "imagenet_vit_small", "imagenet_vit_base"])
def test_gpu_recipes_run_one_step_on_cpu(recipe, tmp_path):
    from _images import write_cifar10, write_cifar100

    if recipe.startswith("cifar10_"):
        write_cifar10(tmp_path)
        data = ["--data.init_args.download=false", "--data.init_args.val_size=20"]
    elif recipe.startswith("cifar100"):
        write_cifar100(tmp_path)
        data = ["--data.init_args.download=false", "--data.init_args.val_size=100"]
    else:
        for split in ("train", "val"):
            write_class_folders(tmp_path / split, ["n01", "n02"], per_class=2, size=40)
        data = []
    run = cli([
        "fit", "--config", str(CONFIGS / f"{recipe}.yaml"), f"--data.init_args.root={tmp_path}", *data,
        "--data.init_args.batch_size=2", "--data.init_args.num_workers=0",
        "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto",
        "--trainer.precision=32-true", "--trainer.max_steps=1", "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.save_dir={tmp_path}/logs", f"--checkpoint.dirpath={tmp_path}/ckpt",
        "--test_after_fit=false", "--model.init_args.model_kwargs={depth: 1, drop_path_rate: 0.1}",
    ])
    model = run.model
    assert run.trainer.global_step == 1
    assert model.mixup is not None and model.hparams.label_smoothing == 0.1
    expected_classes = {"cifar10_vit": 10, "cifar100_vit": 100}.get(recipe, 2)
    assert model.model.num_classes == expected_classes
    if recipe.startswith("imagenet"):
        assert model.model_ema is not None and model.img_size == (224, 224)


def test_predict_on_image_files_matches_the_datamodule_inputs(fitted, tmp_path):
    """PNG files of the test digits, prepared from the checkpoint alone, get the same classes as the
    datamodule's own tensors (same size, interpolation and normalisation)."""
    from vit.data import Digits
    from vit.predict import list_images, predict_files

    best = str(sorted((fitted / "ckpt").glob("best-*.ckpt"))[0])
    classifier = load_classifier(best)
    assert classifier.img_size == (16, 16) and classifier.interpolation == "bilinear"
    data = Digits(img_size=16)
    data.setup("test")
    from sklearn.datasets import load_digits

    from vit.data.images import stratified_split

    digits = load_digits()
    test_idx = stratified_split(digits.target, [0.1, 0.2], seed=0)[2][:60]
    for k, i in enumerate(test_idx):
        pixels = np.clip(digits.images[i] * 16, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(tmp_path / f"{k:03d}.png")
    rows = predict_files(classifier, list_images([tmp_path]), top_k=1)
    with torch.no_grad():
        expected = classifier(torch.stack([data.test_set[k][0] for k in range(60)])).argmax(-1)
    agree = np.mean([r["classes"][0] == str(int(e)) for r, e in zip(rows, expected)])
    assert agree >= 0.95


def test_tensorboard_logger_config_writes_events(tmp_path):
    args = short_run(tmp_path, "--config", str(CONFIGS / "loggers" / "tensorboard.yaml"), steps=2)
    main(["fit", *args, "--test_after_fit=false"])
    runs = list((tmp_path / "logs").rglob("events.out.tfevents.*"))
    assert runs and (runs[0].parent / "config.yaml").is_file()


def test_ddp_on_two_cpu_processes_with_ema(tmp_path):
    """The DDP path (gloo on CPU): every trainable parameter takes part in the loss."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "vit.cli", "fit", *short_run(tmp_path), "--trainer.strategy=ddp",
           "--trainer.devices=2", "--trainer.max_steps=2", "--test_after_fit=false"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "ckpt" / "last.ckpt").is_file()
