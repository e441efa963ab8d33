"""Function matching (`vit.tasks.FunctionMatching`): its losses against hand formulas, the mixing, the recipe with
an unlabelled pool, a frozen ViT-B/16 feature teacher, and the one-line errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests import CONFIGS
from tests.conftest import quiet_run
from tests.formats import write_class_folders
from tests.helpers import TINY_DIM, random_images
from vit.cli.main import cli
from vit.commands import run as run_vit
from vit.deploy import load_classifier
from vit.errors import UserPathError, UserValueError
from vit.tasks.function_matching import (
    feature_matching_loss,
    feature_normalisation,
    function_matching_loss,
    mix_images,
    soft_cross_entropy,
    to_grid,
)

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")]
RECIPE = CONFIGS / "distill_unlabelled.yaml"
SMALL = {"depth": 1, "embed_dim": TINY_DIM, "num_heads": 2}


# ---- hand formulas, in numpy float64 ------------------------------------------------------------
def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_the_kl_is_big_vision_s_distillation_loss_on_random_logits():
    rng = np.random.default_rng(0)
    for tau in (1.0, 2.0, 4.0):
        student, teacher = rng.normal(0, 3, (16, 10)), rng.normal(0, 3, (16, 10))
        pt, ps = softmax(teacher / tau), softmax(student / tau)
        # big_vision (proj/distill): softmax_xent(student, softmax(teacher)) = -sum p_t log p_s; minus the
        # teacher's entropy (no gradient) it is KL(p_t || p_s)
        xent = -(pt * np.log(ps)).sum(-1).mean()
        entropy = -(pt * np.log(pt)).sum(-1).mean()
        got = function_matching_loss(torch.tensor(student, dtype=torch.float32),
                                     torch.tensor(teacher, dtype=torch.float32), tau).item()
        assert abs(got - tau**2 * (xent - entropy)) <= 1e-6 * max(1.0, tau**2 * (xent - entropy))
    targets = softmax(rng.normal(size=(4, 5)))
    logits = rng.normal(size=(4, 5))
    expected = -(targets * np.log(softmax(logits))).sum(-1).mean()
    assert soft_cross_entropy(torch.tensor(logits), torch.tensor(targets)).item() == pytest.approx(expected, abs=1e-6)


def test_the_feature_loss_is_one_minus_the_cosines():
    rng = np.random.default_rng(1)
    pooled, t_pooled = rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
    patches, t_patches = rng.normal(size=(3, 4, 6)), rng.normal(size=(3, 4, 6))
    cos = lambda a, b: (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    expected = (1 - cos(pooled, t_pooled).mean()) + (1 - cos(patches, t_patches).mean())
    got = feature_matching_loss(*(torch.tensor(a, dtype=torch.float32) for a in (pooled, patches, t_pooled, t_patches)))
    assert got.item() == pytest.approx(expected, abs=1e-6)
    # a teacher's 4x4 patch grid pooled to the student's 2x2: each cell the mean of its 2x2 block
    grid = rng.normal(size=(1, 16, 3))
    blocks = grid.reshape(1, 2, 2, 2, 2, 3).mean(axis=(2, 4)).reshape(1, 4, 3)
    np.testing.assert_allclose(to_grid(torch.tensor(grid), (4, 4), (2, 2)).numpy(), blocks, atol=1e-12)
    assert to_grid(torch.tensor(grid), (4, 4), (8, 8)).shape == (1, 64, 3)


def test_labelled_rows_mix_among_themselves_and_the_pool_with_any_row():
    torch.manual_seed(0)
    np.random.seed(0)
    x = torch.randn(10, 3, 8, 8)
    for _ in range(5):
        mixed, partners, lam = mix_images(x, 4, "mixup", 1.0)
        assert set(partners[:4].tolist()) == set(range(4))  # a permutation of the labelled rows
        torch.testing.assert_close(mixed, lam * x + (1 - lam) * x[partners])
        cut, partners, lam = mix_images(x, 4, "cutmix", 1.0)
        row = next(i for i in range(10) if partners[i] != i)  # a row with another row as its partner
        changed = cut[row] != x[row]
        assert changed.any(0).float().mean().item() == pytest.approx(1 - lam, abs=1e-6)  # the box: 1 - lam of it
        assert torch.equal(torch.where(changed, x[partners[row]], x[row]), cut[row])  # the partner's pixels there
    same, partners, lam = mix_images(x, 4, "none", 1.0)
    assert same is x and lam == 1.0


# ---- the recipe, with a pool, at a reduced size ---------------------------------------------------
def teacher_checkpoint(folder: Path, classes: list[str]) -> Path:
    """A tiny untrained convnet teacher of ``classes``, saved as `vit fit` saves one."""
    from vit.checkpoints.io import save_checkpoint
    from vit.checkpoints.meta import classifier_checkpoint
    from vit.tasks import ImageClassifier

    teacher = ImageClassifier(backbone="timm", model="resnet10t", num_classes=len(classes), class_names=classes,
                              model_kwargs={"channels": [8, 16, 32, 64], "stem_width": 8, "output_stride": 16},
                              img_size=16, preprocessing={"mean": [0.5] * 3, "std": [0.5] * 3})
    path = folder / "best-epoch=0-step=1.ckpt"
    save_checkpoint(classifier_checkpoint(teacher.checkpoint_meta(), teacher.model.state_dict()), path)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fm")
    write_class_folders(root / "labelled", ["a", "b"], per_class=20, size=20)
    random_images(root / "pool" / "sub", 48, size=(20, 20), mode="RGB")
    teacher_checkpoint(root / "teacher", ["a", "b"])
    return root


def recipe_args(root: Path, data: Path, *extra: str) -> list[str]:
    return ["fit", *quiet_run(root, str(RECIPE)), f"--data.init_args.root={data / 'labelled'}",
            "--data.init_args.img_size=16", "--data.init_args.batch_size=8", "--data.init_args.num_workers=0",
            f"--model.init_args.teacher_dir={data / 'teacher'}", f"--model.init_args.model_kwargs={SMALL}",
            "--trainer.max_epochs=1", "--trainer.log_every_n_steps=1", "--test_after_fit=false", *extra]


def test_the_recipe_trains_on_labelled_and_pool_and_its_checkpoint_names_the_teacher(data, tmp_path):
    run = cli(recipe_args(tmp_path, data, f"--data.init_args.unlabelled_root={data / 'pool'}"))
    assert run.trainer.global_step == 4  # 32 labelled at 8 a batch, and 8 pool images a step (unlabelled_ratio 1)
    assert run.datamodule.state_dict()["unlabelled_position"] == [1, 0]  # epoch 0 done: the next one's start
    assert run.model.teacher.source.endswith("best-epoch=0-step=1.ckpt")
    assert "teacher_ms" in run.trainer.logged_metrics and "train_kl" in run.trainer.logged_metrics
    best = Path(run.best_checkpoint.best_model_path)
    saved = torch.load(best, weights_only=True)
    assert saved["vit"]["teacher"].endswith("best-epoch=0-step=1.ckpt")
    classifier = load_classifier(best)  # predict, serve and export read it as any classifier
    assert classifier.class_names == ["a", "b"]
    assert classifier(torch.zeros(1, 3, 16, 16)).shape == (1, 2)


def test_wrong_teacher_path_other_classes_and_an_empty_pool_end_in_one_line(data, tmp_path):
    (tmp_path / "empty").mkdir()
    teacher_checkpoint(tmp_path / "other", ["a", "c"])
    cases = [
        ([f"--model.init_args.teacher={tmp_path / 'nope.ckpt'}"], UserPathError, "nope.ckpt"),
        ([f"--model.init_args.teacher_dir={tmp_path / 'other'}"], UserValueError, "trained on the classes"),
        ([f"--data.init_args.unlabelled_root={tmp_path / 'empty'}"], UserValueError, "holds no image files"),
    ]
    for extra, error, words in cases:
        with pytest.raises(error, match=words) as caught:
            run_vit(recipe_args(tmp_path / "run", data, *extra))
        assert "\n" not in str(caught.value)


def test_a_frozen_random_vit_b16_teaches_features(data, tmp_path):
    """A stand-in for DINOv2/SigLIP: a random-weight timm ViT-B/16 file, seen at 32 px (a 2x2 grid)."""
    import timm
    from safetensors.torch import save_file

    weights = tmp_path / "vit_b16.safetensors"
    save_file(timm.create_model("vit_base_patch16_224", pretrained=False).state_dict(), str(weights))
    run = cli(recipe_args(tmp_path, data, f"--model.init_args.features={weights}", "--model.init_args.teacher=null",
                          "--model.init_args.features_img_size=32", "--model.init_args.teacher_bf16=false",
                          f"--data.init_args.unlabelled_root={data / 'pool'}"))
    model = run.model
    assert model.teacher is None and model.feature_teacher.source.startswith(str(weights))
    assert not any(p.requires_grad for p in model.feature_teacher.network.parameters())
    assert "projections.pooled.weight" in model.state_dict() and "feature_teacher" not in str(model.state_dict().keys())
    # the step's feature loss, recomputed by hand from the teacher's tokens and the student's
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        parts = model.losses(x, torch.tensor([0, 1]), 0, torch.arange(2), 1.0)
        vit_b = model.feature_teacher.network.vit
        big = torch.nn.functional.interpolate(x, size=(32, 32), mode="bicubic", align_corners=False)
        big = big * model.feature_teacher.scale + model.feature_teacher.shift if model.feature_teacher.scale.numel() \
            else big
        tokens = vit_b.forward_features(big)
        t_pooled, t_patches = tokens[:, 0], tokens[:, 1:]  # the teacher's 2x2 grid is the student's
        s_tokens = model.model.tokens(x)
        s_pooled = model.projections["pooled"](model.model.forward_head(s_tokens, pre_logits=True))
        s_patches = model.projections["patches"](s_tokens[:, 1:])
        cos = torch.nn.functional.cosine_similarity
        expected = (1 - cos(s_pooled, t_pooled, dim=-1).mean()) + \
            (1 - cos(s_patches, t_patches, dim=-1).mean())
    assert math.isclose(parts["features"].item(), expected.item(), abs_tol=1e-5)


@pytest.mark.slow
def test_a_run_killed_at_an_epoch_end_then_mid_epoch_with_two_workers_resumes_to_the_uninterrupted_weights(data,
                                                                                                         tmp_path):
    """With 2 loader workers (each sample's draws are its own, not the worker's), mixup drawn each step and the
    recipe's max_steps (2000): killed at step 5 (last.ckpt: epoch 1's end, step 4), resumed and killed at step 6
    (last.ckpt every 5 steps: step 5, batch 1 of epoch 2), resumed again: the uninterrupted run's weights, bit for
    bit. Each resume failed once: the first stopped at once, Lightning (2.6) having counted epoch 1 twice under
    max_steps (`vit.cli.training.EpochEndResume`); the second restarted the pool's epoch at its first batch (a
    worker loader calls iter(sampler) twice, `vit.data.pool.PoolSampler`)."""
    from vit.commands import main

    args = (f"--data.init_args.unlabelled_root={data / 'pool'}", "--data.init_args.num_workers=2",
            "--trainer.max_epochs=2", "--checkpoint.every_n_train_steps=5", "--trainer.limit_val_batches=1")
    cli(recipe_args(tmp_path / "straight", data, *args))
    last = tmp_path / "resumed" / "ckpt" / "last.ckpt"
    for step, resume, saved in ((5, (), 4), (6, ("--ckpt_path", "last"), 5)):
        crash = ("--trainer.callbacks+=tests.dummies.CrashAtStep", f"--trainer.callbacks.init_args.step={step}")
        with pytest.raises(RuntimeError, match=f"simulated crash at step {step}"):
            main(recipe_args(tmp_path / "resumed", data, *args, *resume, *crash))
        assert torch.load(last, weights_only=True)["global_step"] == saved
    cli(recipe_args(tmp_path / "resumed", data, *args, "--ckpt_path", "last"))
    straight, resumed = (torch.load(tmp_path / run / "ckpt" / "last.ckpt", weights_only=True)
                         for run in ("straight", "resumed"))
    assert resumed["global_step"] == straight["global_step"] == 8
    straight, resumed = straight["state_dict"], resumed["state_dict"]
    assert [k for k in straight if not torch.equal(straight[k], resumed[k])] == []


@pytest.mark.parametrize(("features", "model", "mean", "std"), [
    ("vit_small_patch14_dinov2.lvd142m", "vit_small_patch14_dinov2", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ("siglip.safetensors", "vit_base_patch16_siglip_224", (0.5,) * 3, (0.5,) * 3),  # a file: its architecture's
    # a tag's own statistics win over its architecture's default (timm's vit_base_patch16_224: augreg's 0.5)
    ("vit_base_patch16_224.dino", "vit_base_patch16_224", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ("vit_base_patch16_clip_224.openai", "vit_base_patch16_clip_224", (0.48145466, 0.4578275, 0.40821073),
     (0.26862954, 0.26130258, 0.27577711)),
    ("weights.safetensors", "vit_unknown_to_timm", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # ImageNet's
    ("vit_small_patch14_dinov2.no_such_tag", "vit_small_patch14_dinov2", (0.485, 0.456, 0.406),
     (0.229, 0.224, 0.225)),  # timm raises for an unknown tag: loading the weights names it, not this
])
def test_a_feature_teacher_sees_the_normalisation_it_was_trained_on(tmp_path, features, model, mean, std):
    """The statistics each backbone's authors trained with (DINOv2 and CLIP's repositories, SigLIP's big_vision
    config), not ImageNet's for all: a SigLIP was fed inputs shifted by up to 0.4 of their range."""
    if features.endswith(".safetensors"):  # a weights file: its name says nothing of its training
        features = str(tmp_path / features)
        Path(features).touch()
    got = feature_normalisation(features, model)
    assert got[0] == pytest.approx(mean) and got[1] == pytest.approx(std)
