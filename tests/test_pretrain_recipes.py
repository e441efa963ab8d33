"""Every pre-training recipe in configs/pretrain/ runs whole as written through `vit pretrain`, at a reduced
size, and its encoder loads into the fine-tuning recipe it names, every key checked.

As in tests/test_recipes.py, only the hardware (CPU, fp32, one device), the data root, the model's depth and
width (the decoder's too) and the length of the run are overridden; the rest (masking, loss, optimiser,
schedule, augmentation, pooling, accumulation) is the recipe's.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests import CONFIGS
from tests.conftest import quiet_run
from tests.helpers import TINY_DIM
from tests.test_recipes import CPU, image_data, logged, recipe
from vit.checkpoints.io import read_checkpoint
from vit.cli.main import build_model_and_data, cli

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")]

PRETRAIN = sorted((CONFIGS / "pretrain").glob("*.yaml"))
FINE_TUNING = {  # pre-training recipe -> the recipe that fine-tunes its encoder
    "mae_digits": "digits.yaml", "mae_folder_vit_small": "finetune/folder_vit_small.yaml",
    "mae_folder_vit_base": "finetune/folder_vit_base.yaml",
    "mae_imagenet_vit_base": "finetune/mae_imagenet_vit_base.yaml",
}
SHRUNK = {"depth": 1, "embed_dim": TINY_DIM, "num_heads": 2}
DECODER = ["--model.init_args.decoder_dim=16", "--model.init_args.decoder_depth=1",
           "--model.init_args.decoder_heads=2"]


def shrunk(config: dict) -> dict:
    """The recipe's model options (pooling, drop path, ...) with a small encoder."""
    return {**(config["model"]["init_args"].get("model_kwargs") or {}), **SHRUNK}


def data_args(config: dict, root: Path) -> list[str]:
    if config["data"]["class_path"].endswith("Digits"):
        return ["--data.init_args.batch_size=32"]
    return image_data(config, root)  # train/ and val/ class folders of 48x48 JPEGs, at 32x32


def test_every_pretraining_recipe_has_a_fine_tuning_recipe():
    assert {p.stem for p in PRETRAIN} == set(FINE_TUNING)
    assert all((CONFIGS / name).is_file() for name in FINE_TUNING.values())


@pytest.mark.parametrize("path", PRETRAIN, ids=lambda p: p.stem)
def test_pretraining_recipe_runs_whole_and_its_encoder_fine_tunes(path, tmp_path):
    config = recipe(path)
    data = data_args(config, tmp_path / "data")
    run = cli([
        "pretrain", *quiet_run(tmp_path, str(path)), *data, *CPU, "--trainer.max_epochs=1",
        "--trainer.check_val_every_n_epoch=1", "--trainer.log_every_n_steps=1", f"--model.init_args.model_kwargs="
        f"{shrunk(config)}", "--model.init_args.figure_every_n_epochs=1", *DECODER,
    ])
    trainer = run.trainer
    accumulate = config["trainer"].get("accumulate_grad_batches", 1)
    assert trainer.global_step == math.ceil(trainer.num_training_batches / accumulate)
    assert trainer.num_training_batches * run.datamodule.batch_size >= 256  # a few hundred images, its transform
    assert all(math.isfinite(v) for v in logged(trainer, "train_loss")) and logged(trainer, "val_loss")
    assert list((Path(trainer.log_dir) / "reconstructions").glob("epoch_*.png"))
    last = tmp_path / "ckpt" / "last.ckpt"
    encoder = {k[6:]: v for k, v in read_checkpoint(last)["state_dict"].items() if k.startswith("model.")}

    fine_tuning = CONFIGS / FINE_TUNING[path.stem]
    classifier, _, _ = build_model_and_data([
        "--config", str(fine_tuning), *data, f"--model.init_args.model_kwargs={shrunk(recipe(fine_tuning))}",
        f"--model.init_args.pretrained={last}",
    ], "test")
    state = classifier.model.state_dict()
    assert set(state) - set(encoder) == {"head.weight", "head.bias"}
    assert all(torch.equal(state[k], v) for k, v in encoder.items())
