"""`vit pretrain`: MAE on a folder of unlabelled images through the CLI, and what its checkpoint is good for:
`vit fit --model.init_args.pretrained` and `vit probe` (strict keys), resuming, clear errors."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from tests import CONFIGS
from tests.commands.test_probe import noisy_colour_folder
from tests.conftest import free_port, quiet_run
from tests.formats import random_rgb
from tests.helpers import TINY_DIM, tiny_mae
from vit.checkpoints.io import read_checkpoint
from vit.cli.main import cli
from vit.commands import main
from vit.errors import UserValueError
from vit.tasks.pretrain import MaskedAutoencoder

# the CLI runs are slow; the MAE task's own checks at the end are not
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

RECIPE = str(CONFIGS / "pretrain" / "mae_folder_vit_small.yaml")
SHRUNK_MODEL = f"{{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2, patch_size: 8}}"  # a 4x4 grid at 32x32
CPU = ["--trainer.accelerator=cpu", "--trainer.precision=32-true"]


def pretrain_args(root: Path, images: Path, epochs: int = 2) -> list[str]:
    """The ViT-S folder recipe on a CPU, shrunk: a one-block encoder and decoder at 32x32, batches of 8."""
    return [
        *quiet_run(root, RECIPE, str(CONFIGS / "loggers" / "tensorboard.yaml")), *CPU,
        f"--data.init_args.root={images}", "--data.init_args.img_size=32", "--data.init_args.batch_size=8",
        "--data.init_args.num_workers=0", "--data.init_args.val_fraction=0.2",
        f"--model.init_args.model_kwargs={SHRUNK_MODEL}", "--model.init_args.decoder_dim=16",
        "--model.init_args.decoder_depth=1", "--model.init_args.decoder_heads=2", "--model.init_args.warmup_epochs=1",
        "--model.init_args.figure_images=3", f"--trainer.max_epochs={epochs}", "--trainer.check_val_every_n_epoch=1",
        "--trainer.log_every_n_steps=1",
    ]


def unlabelled(root: Path) -> Path:
    """40 images: some in a class folder (ignored), some loose."""
    noisy_colour_folder(root, per_class=10)  # 30 in red/, green/, blue/
    for i in range(10):
        random_rgb(size=32, seed=50 + i).save(root / f"loose_{i}.png")
    return root


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> tuple:
    root = tmp_path_factory.mktemp("pretrain")
    images = unlabelled(root / "images")
    run = cli(["pretrain", *pretrain_args(root, images)])
    return run, root, images


@pytest.mark.slow
def test_vit_pretrain_trains_mae_and_writes_its_checkpoint_and_figures(pretrained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, root, _ = pretrained
    trainer, model = run.trainer, run.model
    assert trainer.global_step == 2 * 4  # 32 training images in batches of 8, two epochs
    optimizer = trainer.optimizers[0]
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.95) and optimizer.defaults["fused"]
    assert optimizer.param_groups[0]["initial_lr"] == pytest.approx(1.5e-4 * 8 / 256)  # blr x batch / 256
    assert model.visible == 4 and not model.model.pos_embed.requires_grad  # 16 patches, 4 seen; fixed positions
    checkpoint = read_checkpoint(root / "ckpt" / "last.ckpt")
    assert checkpoint["vit"]["task"] == "pretrain" and checkpoint["global_step"] == 8
    assert any(k.startswith("decoder.") for k in checkpoint["state_dict"])
    best = Path(run.best_checkpoint.best_model_path)
    assert best.name.startswith("best-") and run.best_checkpoint.monitor == "val_loss"
    log_dir = Path(trainer.log_dir)
    assert sorted(p.name for p in (log_dir / "reconstructions").iterdir()) == ["epoch_0000.png", "epoch_0001.png"]
    events = EventAccumulator(str(log_dir)).Reload()
    assert "pretrain/reconstruction" in events.Tags()["images"]
    assert {"train_loss", "val_loss"} <= set(events.Tags()["scalars"])
    assert all(math.isfinite(e.value) for e in events.Scalars("val_loss"))


@pytest.mark.slow
def test_the_checkpoint_starts_vit_fit_and_vit_probe_with_every_encoder_key(pretrained, tmp_path):
    from vit.cli.main import build_model_and_data

    _, root, _ = pretrained
    last = root / "ckpt" / "last.ckpt"
    labelled = noisy_colour_folder(tmp_path / "labelled", per_class=8)
    encoder = {k[len("model."):]: v for k, v in read_checkpoint(last)["state_dict"].items() if k.startswith("model.")}
    fit_args = ["--config", str(CONFIGS / "finetune" / "folder_vit_small.yaml"), f"--data.init_args.root={labelled}",
                "--data.init_args.img_size=32", "--data.init_args.num_workers=0", "--data.init_args.batch_size=8",
                f"--model.init_args.model_kwargs={SHRUNK_MODEL}", f"--model.init_args.pretrained={last}"]
    classifier, _, _ = build_model_and_data(fit_args, "test")  # what `vit probe` builds
    state = classifier.model.state_dict()
    assert set(state) - set(encoder) == {"head.weight", "head.bias"}  # every other key came from the checkpoint
    assert all(torch.equal(state[k], v) for k, v in encoder.items())
    figures = main(["probe", *fit_args, "--cache_dir", str(tmp_path / "cache"), "--out", str(tmp_path / "p.ckpt"),
                    "--C", "1", "--k", "1"])
    assert figures is None or (tmp_path / "p.ckpt").is_file()
    fit = cli(["fit", *fit_args, *CPU, "--trainer.max_epochs=1", "--test_after_fit=false",
               f"--trainer.default_root_dir={tmp_path}", f"--checkpoint.dirpath={tmp_path}/ft",
               "--trainer.logger=false", "--trainer.enable_progress_bar=false"])
    assert fit.trainer.global_step > 0 and fit.model.pretrained_loaded


@pytest.mark.slow
def test_an_interrupted_pretraining_resumes_from_last(pretrained, tmp_path):
    _, root, images = pretrained
    shutil.copytree(root / "ckpt", tmp_path / "ckpt")  # a copy: the module's other tests read the fixture's last.ckpt
    resumed = cli(["pretrain", *pretrain_args(tmp_path, images, epochs=3), "--ckpt_path", "last"])
    assert resumed.trainer.global_step == 3 * 4 and resumed.trainer.current_epoch == 3
    assert read_checkpoint(tmp_path / "ckpt" / "last.ckpt")["global_step"] == 12
    assert read_checkpoint(root / "ckpt" / "last.ckpt")["global_step"] == 8


@pytest.mark.slow
def test_the_wrong_task_is_a_clear_error(pretrained, capsys):
    _, root, _ = pretrained
    with pytest.raises(SystemExit):
        main(["pretrain", "--config", str(CONFIGS / "digits.yaml"), "--trainer.max_epochs=1"])
    assert "vit pretrain trains a self-supervised model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(CONFIGS / "digits.yaml"), "--ckpt_path", str(root / "ckpt" / "last.ckpt")])
    err = capsys.readouterr().err
    assert "holds the MaskedAutoencoder task ('pretrain'), but the ImageClassifier" in err and "Traceback" not in err


@pytest.mark.processes
@pytest.mark.slow
def test_vit_pretrain_under_ddp_on_two_cpu_processes(tmp_path):
    """Two gloo ranks: each trains on its share, val_loss is synced, rank 0 alone draws and saves."""
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    cmd = [sys.executable, "-m", "vit", "pretrain", *quiet_run(tmp_path, str(CONFIGS / "pretrain" / "mae_digits.yaml")),
           "--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.max_epochs=2", "--trainer.limit_train_batches=3",
           "--trainer.limit_val_batches=2", "--trainer.check_val_every_n_epoch=1", "--trainer.log_every_n_steps=1",
           "--model.init_args.figure_every_n_epochs=1",
           f"--model.init_args.model_kwargs={{depth: 1, embed_dim: {TINY_DIM}}}",
           "--model.init_args.decoder_dim=16", "--model.init_args.decoder_depth=1", "--data.init_args.batch_size=64"]
    port = free_port()
    env = subprocess_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("global batch 128") == 1  # lr = blr x (64 per rank x 2 ranks) / 256, said once
    assert read_checkpoint(tmp_path / "ckpt" / "last.ckpt")["global_step"] == 6
    run_dir = tmp_path / "logs" / "mae_digits" / "version_0"
    assert sorted(p.name for p in (run_dir / "reconstructions").iterdir()) == ["epoch_0000.png", "epoch_0001.png"]


def test_mae_masks_the_ratio_of_patches_and_pastes_the_visible_ones_back():
    task = tiny_mae(mask_ratio=0.75).eval()
    assert isinstance(task, MaskedAutoencoder)
    images = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    out, mask = task.reconstruct(images, torch.Generator().manual_seed(1))
    n = mask.shape[1]
    assert mask.sum(1).tolist() == [n - int(n * (1 - 0.75))] * 3  # MAE's len_keep = int(L * (1 - ratio))
    side = math.isqrt(n)
    p = 8 // side  # the patch side
    shown = mask.view(3, 1, side, side).repeat_interleave(p, 2).repeat_interleave(p, 3) == 0
    assert torch.equal(out[shown], images[shown])  # the visible patches are the image itself
    assert not torch.allclose(out[~shown], images[~shown])


@pytest.mark.parametrize("ratio", [0.0, 1.0])
def test_mae_needs_some_patches_visible_and_some_masked(ratio):
    with pytest.raises(UserValueError, match=f"mask_ratio {ratio} leaves"):
        tiny_mae(mask_ratio=ratio)
