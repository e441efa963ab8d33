"""FixMatch (`vit.tasks.FixMatch`, configs/semi_small.yaml) at a reduced size: labelled and pool in one step, the
temperature fit on val and saved, the checkpoint a plain classifier, and a task without a pool trains as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests import CONFIGS
from tests.conftest import quiet_run
from tests.formats import write_class_folders
from tests.helpers import TINY_DIM, random_images
from vit.cli.main import cli
from vit.deploy import load_classifier
from vit.deploy.calibration import fit_temperature
from vit.errors import UserValueError
from vit.tasks.semi import FixMatch

RECIPE = CONFIGS / "semi_small.yaml"
SMALL = f"{{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2}}"
# With 2 classes every pseudo-label reaches 0.5: the pool's batches change the weights (at 0.95 the tiny model's
# are all masked, and a resume that read other pool images would still end bitwise equal)
EVERY_POOL_IMAGE_COUNTS = ("--model.init_args.threshold=0.5",)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("semi")
    write_class_folders(root / "labelled", ["a", "b"], per_class=20, size=20)
    random_images(root / "pool" / "sub", 48, size=(20, 20), mode="RGB")
    return root


def recipe_args(root: Path, data: Path, *extra: str) -> list[str]:
    return ["fit", *quiet_run(root, str(RECIPE)), f"--data.init_args.root={data / 'labelled'}",
            "--data.init_args.img_size=16", "--data.init_args.batch_size=8", "--data.init_args.num_workers=0",
            f"--model.init_args.model_kwargs={SMALL}", "--trainer.max_epochs=1", "--trainer.log_every_n_steps=1",
            "--test_after_fit=false", *extra]


def test_the_recipe_trains_on_labelled_and_pool_and_fits_the_temperature_on_val(data, tmp_path):
    run = cli(recipe_args(tmp_path, data, f"--data.init_args.unlabelled_root={data / 'pool'}",
                          "--data.init_args.unlabelled_ratio=2"))
    assert run.trainer.global_step == 4  # 32 labelled at 8 a batch, 16 pool images (2 views each) a step
    assert "pool_mask" in run.trainer.logged_metrics
    model = run.model.eval()
    val = run.datamodule.val_dataloader()
    with torch.no_grad():
        logits = torch.cat([model(x) for x, _ in val])
    labels = torch.cat([y for _, y in val])
    assert float(model.temperature) == pytest.approx(fit_temperature(logits, labels), rel=1e-5)
    assert float(model.temperature) != 1.0
    best = Path(run.best_checkpoint.best_model_path)
    assert torch.load(best, weights_only=True)["state_dict"]["temperature"] == model.temperature
    classifier = load_classifier(best)  # predict, serve and export read it as any classifier
    assert classifier.class_names == ["a", "b"] and classifier(torch.zeros(1, 3, 16, 16)).shape == (1, 2)


def test_without_a_pool_it_trains_on_the_labels_alone(data, tmp_path):
    run = cli(recipe_args(tmp_path, data, "--model.init_args.calibrate=false"))
    assert run.trainer.global_step == 4 and float(run.model.temperature) == 1.0  # not calibrated: T stays 1


@pytest.mark.parametrize(("threshold", "weight"), [(0.0, 1.0), (1.01, 1.0), (0.9, -1.0)])
def test_a_threshold_outside_0_1_or_a_negative_weight_is_refused(threshold, weight):
    with pytest.raises(UserValueError, match="threshold must be in"):
        FixMatch(model="vit_digits_patch2_8", num_classes=2, threshold=threshold, unlabelled_weight=weight)


@pytest.mark.slow
# With the recipe's own max_steps (600; epochs end the run either way) Lightning (2.6) reran epoch 1's end on the
# resume, counted it twice and stopped at max_epochs with epoch 1's weights (`vit.cli.training.EpochEndResume`)
@pytest.mark.parametrize("max_steps", ["-1", "600"])
def test_a_run_killed_in_its_second_epoch_resumes_to_the_uninterrupted_weights_and_temperature(data, tmp_path,
                                                                                                max_steps):
    """Killed after epoch 1's last.ckpt (in epoch 2), resumed with --ckpt_path last: the same weights and T, bit
    for bit (the pool's position and T travel in the checkpoint). It failed when the pool's sampler read its epoch
    from set_epoch: Lightning builds a resumed run's first iterator before calling it, so the pool read an empty
    epoch 0, and the second iterator it then needed drew once more from torch's generator."""
    from vit.commands import main

    pool = (f"--data.init_args.unlabelled_root={data / 'pool'}", "--data.init_args.unlabelled_ratio=2",
            "--trainer.max_epochs=2", f"--trainer.max_steps={max_steps}", "--num_threads=1", *EVERY_POOL_IMAGE_COUNTS)
    cli(recipe_args(tmp_path / "straight", data, *pool))
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(recipe_args(tmp_path / "resumed", data, *pool, "--trainer.callbacks+=tests.dummies.CrashAtStep",
                         "--trainer.callbacks.init_args.step=5"))
    cli(recipe_args(tmp_path / "resumed", data, *pool, "--ckpt_path", "last"))
    straight, resumed = (torch.load(tmp_path / run / "ckpt" / "last.ckpt", weights_only=True)["state_dict"]
                         for run in ("straight", "resumed"))
    assert float(straight["temperature"]) != 1.0
    assert all(torch.equal(straight[k], resumed[k]) for k in straight), [k for k in straight
                                                                           if not torch.equal(straight[k], resumed[k])]


@pytest.mark.slow
def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_weights_and_temperature(data, tmp_path):
    """last.ckpt every 5 steps, killed at step 6 (batch 3 of epoch 2), resumed from step 5 with --ckpt_path last:
    the labelled loader's order and draws (`vit.data.resume`) and the pool's batches go on where they were."""
    from vit.commands import main

    args = (f"--data.init_args.unlabelled_root={data / 'pool'}", "--data.init_args.unlabelled_ratio=2",
            "--trainer.max_epochs=2", "--num_threads=1", "--checkpoint.every_n_train_steps=5", *EVERY_POOL_IMAGE_COUNTS)
    cli(recipe_args(tmp_path / "straight", data, *args))
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(recipe_args(tmp_path / "resumed", data, *args, "--trainer.callbacks+=tests.dummies.CrashAtStep",
                         "--trainer.callbacks.init_args.step=6"))
    assert torch.load(tmp_path / "resumed" / "ckpt" / "last.ckpt", weights_only=True)["global_step"] == 5
    cli(recipe_args(tmp_path / "resumed", data, *args, "--ckpt_path", "last"))
    straight, resumed = (torch.load(tmp_path / run / "ckpt" / "last.ckpt", weights_only=True)["state_dict"]
                         for run in ("straight", "resumed"))
    assert float(straight["temperature"]) != 1.0
    assert [k for k in straight if not torch.equal(straight[k], resumed[k])] == []
