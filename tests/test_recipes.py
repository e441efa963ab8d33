"""Every recipe in configs/ runs its whole pipeline as written, at a reduced size: data in the recipe's
own format, its transforms over a few hundred images, its model (shrunk), checkpoints, and test.

Only the hardware (CPU, fp32, one device), the data root, the model's depth and width and the length
of the run are overridden; everything else (augmentation, mixup, EMA, schedule, losses) is the recipe's.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
import yaml

from tests import CONFIGS
from tests.conftest import quiet_run
from tests.formats import CORPUS, write_cifar10, write_cifar100, write_class_folders
from tests.helpers import TINY_DIM
from vit.cli.main import cli
from vit.deploy import load_classifier

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")]

RECIPES = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name != "loggers")
CPU = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.num_nodes=1", "--trainer.strategy=auto",
       "--trainer.precision=32-true"]


def cpu_strategy(config: dict) -> list[str]:
    """An FSDP recipe runs under DDP here: Lightning refuses FSDP on a CPU (its strategy is checked in
    tests/tasks/test_scale.py)."""
    strategy = config["trainer"].get("strategy")
    fsdp = isinstance(strategy, dict) and strategy["class_path"].endswith("FSDPStrategy")
    return ["--trainer.strategy=ddp"] if fsdp else []


def recipe(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def logged(trainer, name: str) -> list[float]:
    """Every value of ``name`` in the run's metrics.csv."""
    rows = csv.DictReader((Path(trainer.logger.log_dir) / "metrics.csv").open())
    return [float(row[name]) for row in rows if row.get(name)]


def image_data(config: dict, root: Path) -> list[str]:
    """Synthetic data in the recipe's own format, and the options that point the recipe at it."""
    kind = config["data"]["class_path"].rsplit(".", 1)[-1]
    args = [f"--data.init_args.root={root}", "--data.init_args.num_workers=0", "--data.init_args.batch_size=32"]
    if kind == "CIFAR":
        variant = config["data"]["init_args"].get("variant", 10)
        if variant == 10:
            write_cifar10(root, per_batch=64, n_test=64)  # 320 training images
        else:
            write_cifar100(root, n_train=400, n_test=100)
        return [*args, "--data.init_args.download=false", f"--data.init_args.val_size={variant}",
                "--data.init_args.img_size=32"]
    for split, per_class in (("train", 160), ("val", 16), ("test", 16)):  # 320 training JPEGs, 48x48, 2 classes
        write_class_folders(root / split, ["n01", "n02"], per_class=per_class, size=48, seed=len(split))
    from vit.nn.configs import MODEL_CONFIGS

    patch = MODEL_CONFIGS.get(config["model"]["init_args"]["model"], {}).get("patch_size", 16)  # (a convnet: 16)
    return [*args, f"--data.init_args.img_size={2 * patch}"]  # 32, or 28 for DINOv2's 14 px patches


SHRUNK = {"depth": 1, "embed_dim": TINY_DIM, "num_heads": 2, "drop_path_rate": 0.1}
SHRUNK_CONVNET = {"channels": [8, 16, 32, 64], "stem_width": 8, "output_stride": 16, "drop_path_rate": 0.05}


def shrunk(config: dict) -> dict:
    """The model_kwargs that shrink the recipe's network: a ViT's depth and width, a timm ResNet's channels."""
    return SHRUNK_CONVNET if config["model"]["init_args"].get("backbone") == "timm" else SHRUNK


def teacher_folder(config: dict, folder: Path) -> list[str]:
    """For a distillation recipe (``teacher: best``): a folder holding a best-*.ckpt of a tiny convnet teacher of
    the synthetic data's classes, written as `vit fit` writes one, and the option that points the recipe at it."""
    if config["model"]["init_args"].get("teacher") != "best":
        return []
    from vit.checkpoints.io import save_checkpoint
    from vit.checkpoints.meta import classifier_checkpoint
    from vit.tasks import ImageClassifier

    teacher = ImageClassifier(backbone="timm", model="resnet10t", model_kwargs=SHRUNK_CONVNET, num_classes=2,
                              class_names=["n01", "n02"], img_size=32, mean=[0.5] * 3, std=[0.5] * 3)
    checkpoint = classifier_checkpoint(teacher.checkpoint_meta(), teacher.model.state_dict())
    save_checkpoint(checkpoint, folder / "teacher" / "best-epoch=0-step=1.ckpt")
    return [f"--model.init_args.teacher_dir={folder / 'teacher'}"]


def pretrained_file(config: dict, folder: Path) -> list[str]:
    """For a recipe that starts from pretrained weights: a timm-format .safetensors file of its (shrunk)
    architecture at its native resolution, random weights, so loading and pos_embed resampling run."""
    init = config["model"]["init_args"]
    if not init.get("pretrained"):
        return []
    from safetensors.torch import save_file

    import vit

    path = folder / "pretrained.safetensors"
    save_file(vit.create_model(init["model"], **SHRUNK).state_dict(), str(path))
    return [f"--model.init_args.pretrained={path}"]


@pytest.mark.parametrize("path", [p for p in RECIPES if recipe(p)["data"]["class_path"].endswith(
    ("CIFAR", "ImageFolder", "ImageNet"))], ids=lambda p: p.stem)
def test_image_recipe_runs_its_whole_pipeline(path, tmp_path):
    config = recipe(path)
    run = cli([
        "fit", *quiet_run(tmp_path, str(path), calibrate=True), *image_data(config, tmp_path / "data"), *CPU,
        *cpu_strategy(config),
        *pretrained_file(config, tmp_path), *teacher_folder(config, tmp_path), "--trainer.max_epochs=1",
        "--trainer.log_every_n_steps=1", "--test_after_fit=true",
        f"--model.init_args.model_kwargs={shrunk(config)}",
    ])
    trainer, model = run.trainer, run.model
    assert type(trainer.strategy).__name__ == ("DDPStrategy" if cpu_strategy(config) else "SingleDeviceStrategy")
    images = trainer.num_training_batches * run.datamodule.batch_size
    accumulate = config["trainer"].get("accumulate_grad_batches", 1)
    assert trainer.global_step == math.ceil(trainer.num_training_batches / accumulate)  # the last, partial, steps too
    assert images >= 256, "a few hundred images through the training transform"
    losses = logged(trainer, "train_loss")
    assert losses and all(math.isfinite(v) for v in losses)
    init = config["model"]["init_args"]
    head = (init.get("head") or {}).get("init_args") or {}
    mixup = head.get("mixup_alpha", 0) > 0 or head.get("cutmix_alpha", 0) > 0
    from vit.tasks.losses import SoftTargetCrossEntropy

    assert isinstance(model.train_loss, SoftTargetCrossEntropy) == mixup  # the loss the recipe implies
    assert (model.model_ema is not None) == ((init.get("optim") or {}).get("ema_decay") is not None)
    assert model.model.num_classes == len(run.datamodule.class_names)
    best = Path(run.best_checkpoint.best_model_path)
    assert best.is_file() and (best.parent / "last.ckpt").is_file()
    classifier = load_classifier(best)  # the checkpoint alone rebuilds the model...
    assert classifier.img_size == (run.datamodule.img_size,) * 2
    assert classifier.class_names == run.datamodule.class_names
    assert logged(trainer, "test_acc")  # ... and the test ran on it
    assert "confidence" in torch.load(best, weights_only=True)  # --calibrate true: T and "unknown" in the best
    from vit.tasks.finetune import Adapters

    if isinstance(model.finetune, Adapters):  # adapters (any spelling): the file holds what trained, the base is named
        saved = torch.load(best, weights_only=True)
        assert saved["vit"]["lora"]["base"]["path"] and not any(k.endswith("qkv.weight") for k in saved["state_dict"])
    if "distillation" in init:  # the student learnt from the teacher, which is not in its file
        assert model.teacher.source.endswith("best-epoch=0-step=1.ckpt") and logged(trainer, "teacher_ms")
        assert type(classifier.model).__name__ == "DistilledVisionTransformer"


def test_translate_reverse_recipe_runs_its_whole_pipeline(tmp_path, capsys):
    run = cli([
        "fit", *quiet_run(tmp_path, str(CONFIGS / "translate_reverse.yaml")), *CPU,
        "--data.init_args.num_train=2000", "--data.init_args.num_val=64", "--data.init_args.num_test=64",
        "--trainer.max_steps=40", "--trainer.log_every_n_steps=5", "--trainer.val_check_interval=20",
        f"--model.init_args.embed_dim={TINY_DIM}",
    ])
    assert run.trainer.global_step == 40 and all(math.isfinite(v) for v in logged(run.trainer, "train_loss"))
    assert "test exact match of" in capsys.readouterr().out
    assert (tmp_path / "ckpt" / "last.ckpt").is_file()


def test_translate_tsv_recipe_runs_its_whole_pipeline(tmp_path):
    corpus = tmp_path / "fra.txt"
    lines = [f"{en}\t{fr}\tCC-BY 2.0 (France) Attribution: tatoeba.org" for en, fr in CORPUS * 40]
    corpus.write_text("\n".join([*lines, "a line without a tab", "a very long line " * 30 + "\tx"]) + "\n")
    run = cli([
        "fit", *quiet_run(tmp_path, str(CONFIGS / "translate_tsv.yaml")), *CPU, f"--data.init_args.train={corpus}",
        "--data.init_args.bpe_vocab_size=200", "--trainer.max_epochs=2", "--trainer.log_every_n_steps=1",
        f"--model.init_args.embed_dim={TINY_DIM}",
        "--model.init_args.warmup_steps=10", "--test_after_fit=false",
    ])
    assert run.trainer.global_step > 0 and all(math.isfinite(v) for v in logged(run.trainer, "train_loss"))
    assert run.datamodule.malformed["train"]  # the tab-less line is reported; the long one skipped (the recipe says so)
    assert {"val_bleu", "val_chrf"} <= set(run.trainer.callback_metrics) and run.best_checkpoint.monitor == "val_chrf"
    assert Path(run.best_checkpoint.best_model_path).is_file()
    assert isinstance(run.model.model.head.weight, torch.nn.Parameter)


def test_the_cpu_fine_tuning_recipe_runs_as_written(tmp_path, capsys):
    """configs/finetune/folder_cpu.yaml with only the data root and a timm .safetensors file: the whole run
    (5 epochs, test) on 90 images: 72 train, 2 full batches of the recipe's 32 an epoch, 10 steps (a user's few
    hundred take minutes on 2 cores; the suite's time is short)."""
    import time

    import timm
    from safetensors.torch import save_file

    weights = tmp_path / "vit_tiny_patch16_224.safetensors"
    save_file(timm.create_model("vit_tiny_patch16_224").state_dict(), str(weights))  # timm's format, random
    root = tmp_path / "photos"
    for c, name in enumerate(["cat", "dog", "fox"]):
        write_class_folders(root, [name], per_class=30, size=64, seed=1000 * c)
    start = time.perf_counter()
    run = cli(["fit", "--config", str(CONFIGS / "finetune" / "folder_cpu.yaml"), f"--data.init_args.root={root}",
               f"--model.init_args.pretrained={weights}", f"--trainer.default_root_dir={tmp_path}"])
    seconds = time.perf_counter() - start
    assert run.trainer.current_epoch == 5 and run.trainer.num_training_batches == 2  # batch 32, last partial dropped
    assert run.model.model.patch_embed.grid_size == (6, 6) and run.model.model.num_classes == 3
    assert "test accuracy of" in capsys.readouterr().out
    print(f"folder_cpu.yaml: 90 images, 5 epochs and the test in {seconds:.0f} s")
    assert seconds < 600


@pytest.mark.parametrize("name", ["multilabel_cpu", "finetune/multilabel_cpu"])
def test_the_multilabel_recipes_run_as_written(name, tmp_path, capsys):
    """A multi-label recipe on a folder of digit composites beside a metadata.csv (`file_name,labels,split`), with
    only the root (and the fine-tuning recipe's weights file), shrunk and shortened: the multi-label head from the
    data, the best checkpoint by val macro mAP with its thresholds, and the test macro mAP printed."""
    from tests import load_script
    from vit.tasks.heads import MultiLabelHead

    root = load_script("multilabel_digits").write_composites(tmp_path / "data", {"train": 160, "val": 40, "test": 40})
    config = CONFIGS / f"{name}.yaml"
    run = cli(["fit", "--config", str(config), f"--data.init_args.root={root}",
               f"--trainer.default_root_dir={tmp_path}", "--trainer.max_epochs=2", "--data.init_args.num_workers=0",
               f"--model.init_args.model_kwargs={shrunk(recipe(config))}", *pretrained_file(recipe(config), tmp_path)])
    assert isinstance(run.model.head, MultiLabelHead) and run.datamodule.multi_label
    assert run.best_checkpoint.monitor == "val_map"
    saved = torch.load(run.best_checkpoint.best_model_path, weights_only=False)["vit"]
    assert saved["multi_label"] is True and len(saved["thresholds"]) == 10
    assert load_classifier(run.best_checkpoint.best_model_path).thresholds == saved["thresholds"]
    assert "test macro mAP of" in capsys.readouterr().out
    # curves.png's middle panel: each epoch's val_map (as Lightning's CSV logger wrote them) at its epoch's end
    (curves,) = [c for c in run.trainer.callbacks if type(c).__name__ == "TrainingCurves"]
    with open(Path(run.trainer.log_dir) / "metrics.csv") as table:
        logged = [row for row in csv.DictReader(table) if row["val_map"]]
    assert [v for _, v in curves.val["val_map"]] == [pytest.approx(float(r["val_map"])) for r in logged]
    steps = run.trainer.num_training_batches
    assert [s for s, _ in curves.val["val_map"]] == [steps, 2 * steps]  # after each epoch's last step


def test_clip_captions_recipe_trains_both_towers_and_its_checkpoint_starts_a_zeroshot_fit(tmp_path):
    """configs/clip_captions.yaml on a table of 80 random images with two captions, shrunk; its best checkpoint is
    a ContrastiveTask's that `load_contrastive` rebuilds and `head_init: zeroshot` starts a classifier from."""
    from tests.helpers import random_images
    from vit.tasks import ImageClassifier
    from vit.tasks.contrastive import load_contrastive

    paths = random_images(tmp_path / "images", 80, size=(40, 40), mode="RGB")
    rows = ["path,caption", *(f"{p.name},a photo of {'noise' if i % 2 else 'static'}" for i, p in enumerate(paths))]
    (tmp_path / "images" / "captions.csv").write_text("\n".join(rows) + "\n")
    run = cli(["fit", *quiet_run(tmp_path, str(CONFIGS / "clip_captions.yaml")), *CPU,
               f"--data.init_args.train={tmp_path / 'images' / 'captions.csv'}", "--data.init_args.batch_size=16",
               "--trainer.max_epochs=1", "--trainer.log_every_n_steps=1", "--test_after_fit=false",
               f"--model.init_args.vision_kwargs={SHRUNK}",
               f"--model.init_args.text={{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2}}"])
    assert run.model.clip.visual.config.img_size == 32 and run.trainer.global_step == 4  # 72 pairs, batches of 16
    assert all(math.isfinite(v) for v in logged(run.trainer, "train_loss")) and logged(run.trainer, "val_loss")
    best = Path(run.best_checkpoint.best_model_path)
    clip, _ = load_contrastive(best)
    tower = {**SHRUNK, "proj_dim": 64, "normalize_embedding": True}
    classifier = ImageClassifier(model="vit_scratch_patch8_32", model_kwargs=tower, num_classes=2,
                                 class_names=["noise", "static"], pretrained=str(best), head_init="zeroshot:photo",
                                 img_size=32)
    classifier.configure_model()
    torch.testing.assert_close(classifier.model.head.weight.norm(dim=1), clip.logit_scale.exp().expand(2))
