"""The data follows the weights: a `vit fit` config that sets only ``model.init_args.pretrained`` normalises,
sizes, crops and resizes its images as those weights were trained (timm's ``pretrained_cfg``), says so, and
the checkpoint carries it. The expected values are timm's own table, never ours."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml
from timm.models import get_pretrained_cfg

from tests import CONFIGS
from tests.formats import write_class_folders
from tests.helpers import TINY
from vit.cli.main import cli
from vit.deploy import load_classifier

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

# One tag of each family, and two classic augreg tags (the recipes' other two: the recipe test below).
TAGS = [
    "vit_tiny_patch16_224.augreg_in21k_ft_in1k", "vit_base_patch16_224.augreg2_in21k_ft_in1k",
    "vit_base_patch16_224.mae", "vit_small_patch14_dinov2.lvd142m", "vit_small_patch14_reg4_dinov2.lvd142m",
    "vit_small_patch16_dinov3.lvd1689m", "vit_base_patch16_clip_224.openai", "vit_base_patch16_siglip_224.webli",
    "vit_base_patch16_siglip_224.v2_webli", "deit3_small_patch16_224.fb_in1k",
    "deit_small_distilled_patch16_224.fb_in1k",
]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    write_class_folders(root, ["cat", "dog"], per_class=4, size=40)
    return root


def only_pretrained(folder: Path, model: str, pretrained: str, photos: Path, **data: object) -> Path:
    """A `vit fit` config that names the model, its pretrained weights and the data root, and nothing else."""
    config = {
        "trainer": {"accelerator": "cpu", "max_steps": 1, "logger": False, "enable_progress_bar": False,
                    "enable_model_summary": False, "num_sanity_val_steps": 0, "limit_val_batches": 1},
        "checkpoint": {"dirpath": str(folder / "ckpt")},
        "model": {"class_path": "vit.tasks.ImageClassifier",
                  "init_args": {"model": model, "pretrained": pretrained, "model_kwargs": TINY}},
        "data": {"class_path": "vit.data.ImageFolder",
                 "init_args": {"root": str(photos), "num_workers": 0, "batch_size": 4, **data}},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def expected(tag: str) -> dict:
    cfg = get_pretrained_cfg(tag)
    assert cfg is not None and cfg.tag == tag.split(".")[1]
    return {"img_size": cfg.input_size[-1], "mean": tuple(cfg.mean), "std": tuple(cfg.std), "crop_pct": cfg.crop_pct,
            "interpolation": cfg.interpolation}


@pytest.mark.parametrize("tag", TAGS)
def test_a_config_with_only_pretrained_set_gets_the_tags_preprocessing(tag, tmp_path, photos, caplog):
    want = expected(tag)
    with caplog.at_level(logging.INFO):
        run = cli(["--config", str(only_pretrained(tmp_path, tag.split(".")[0], tag, photos))], run=False)
    data, model = run.datamodule, run.model
    got = {"img_size": data.img_size, "mean": data.mean, "std": data.std, "crop_pct": data.crop_pct,
           "interpolation": data.interpolation}
    assert got == want
    assert model.model.img_size == (want["img_size"],) * 2  # the model is built at the weights' size
    meta = model.checkpoint_meta()  # what on_save_checkpoint writes
    assert (tuple(meta["mean"]), tuple(meta["std"]), meta["crop_pct"], meta["interpolation"]) == (
        want["mean"], want["std"], want["crop_pct"], want["interpolation"])
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("preprocessing from")]
    assert len(said) == 1 and tag.split(".")[1] in said[0] and str(list(want["mean"])) in said[0]


def test_what_the_config_sets_wins_over_the_weights(tmp_path, photos, caplog):
    tag = "vit_base_patch16_siglip_224.webli"
    config = only_pretrained(tmp_path, "vit_base_patch16_siglip_224", tag, photos, mean=[0.1, 0.2, 0.3], img_size=32)
    with caplog.at_level(logging.INFO):
        run = cli(["--config", str(config)], run=False)
    assert run.datamodule.mean == (0.1, 0.2, 0.3) and run.datamodule.img_size == 32
    assert run.datamodule.std == expected(tag)["std"]  # the one it left unset follows the weights
    said = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("preprocessing from"))
    assert "the config sets img_size 32, mean [0.1, 0.2, 0.3]" in said


def test_a_one_channel_checkpoint_fills_all_but_mean_and_std_of_an_rgb_folder(tmp_path, photos, caplog):
    """A digits checkpoint (1 channel, as `vit fit` of configs/digits.yaml writes its "vit" entry) as the
    pretrained weights of an RGB ImageFolder: its size, crop and resize are filled in, its 1-channel mean/std
    are not (an RGB folder needs 3), and the line says so rather than "the config sets mean None"."""
    import torch

    from vit.cli.main import follow_the_weights

    ckpt = tmp_path / "digits.ckpt"
    torch.save({"state_dict": {}, "vit": {
        "task": "classify", "model_name": "vit_tiny_patch16_224", "class_names": [str(d) for d in range(10)],
        "model_config": {"img_size": [8, 8], "in_chans": 1, "patch_size": 2}, "mean": [0.3053], "std": [0.376],
        "crop_pct": 1.0, "interpolation": "bilinear"}}, ckpt)
    unset = dict.fromkeys(["img_size", "mean", "std", "crop_pct", "interpolation"])
    config = {"data": {"class_path": "vit.data.ImageFolder", "init_args": {"root": str(photos), **unset}},
              "model": {"init_args": {"model": "vit_tiny_patch16_224", "pretrained": str(ckpt)}}}
    with caplog.at_level(logging.INFO):
        follow_the_weights(config)
    assert config["data"]["init_args"] == {"root": str(photos), "img_size": 8, "mean": None, "std": None,
                                           "crop_pct": 1.0, "interpolation": "bilinear"}
    said = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("preprocessing from"))
    assert "img_size 8, crop_pct 1.0, interpolation bilinear" in said and "None" not in said, said
    assert "mean and std stay the DataModule's own: the weights' are for 1 channel(s), the data has 3" in said, said


def test_no_pretrained_weights_keeps_the_datamodules_defaults(tmp_path, photos):
    run = cli(["--config", str(only_pretrained(tmp_path, "vit_small_patch16_224", None, photos))], run=False)
    assert run.datamodule.mean == (0.485, 0.456, 0.406) and run.datamodule.img_size == 224  # ImageNet's, as before


@pytest.mark.parametrize("path", ["folder_cpu", "folder_vit_small", "folder_vit_base", "cifar10_vit_base"])
def test_the_shipped_augreg_recipes_normalise_as_their_weights_were_trained(path, tmp_path):
    from vit.cli.main import follow_the_weights

    config = yaml.safe_load((CONFIGS / "finetune" / f"{path}.yaml").read_text())
    data = config["data"]["init_args"]
    assert "mean" not in data and "std" not in data  # the recipe leaves them to the weights ...
    filled = {"data": {"init_args": {**data, "mean": None, "std": None}}, "model": config["model"]}
    follow_the_weights(filled)  # ... as `vit fit` parses it (unset options are None)
    assert filled["data"]["init_args"]["mean"] == [0.5] * 3 and filled["data"]["init_args"]["std"] == [0.5] * 3
    assert filled["data"]["init_args"]["img_size"] == data["img_size"]  # what the recipe sets stays


def test_a_hub_folder_brings_its_config_and_the_checkpoint_carries_it(tmp_path, photos):
    """`pretrained:` a timm hub folder (model.safetensors + config.json, as the Hugging Face cache holds it):
    a whole (one-step) `vit fit`, whose checkpoint then prepares images the same way, with no options."""
    from safetensors.torch import save_file

    import vit

    hub = tmp_path / "hub"
    hub.mkdir()
    save_file(vit.create_model("vit_tiny_patch16_224", **TINY).state_dict(), str(hub / "model.safetensors"))
    pretrained_cfg = {**get_pretrained_cfg("vit_tiny_patch16_224.augreg_in21k_ft_in1k").to_dict(),
                      "input_size": [3, 32, 32], "interpolation": "bilinear"}  # unlike any default
    (hub / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224",
                                                  "pretrained_cfg": pretrained_cfg}))
    cli(["fit", "--config", str(only_pretrained(tmp_path, "vit_tiny_patch16_224", str(hub), photos))])
    classifier = load_classifier(tmp_path / "ckpt" / "last.ckpt")
    assert classifier.mean == (0.5, 0.5, 0.5) and classifier.std == (0.5, 0.5, 0.5)
    assert classifier.img_size == (32, 32) and classifier.interpolation == "bilinear" and classifier.crop_pct == 0.9

    # `vit test --ckpt_path` (or a resume from a file): the data follows the checkpoint, the weights file gone.
    from vit.cli.main import follow_the_weights

    unset = dict.fromkeys(["img_size", "mean", "std", "crop_pct", "interpolation"])
    config = {"ckpt_path": str(tmp_path / "ckpt" / "last.ckpt"), "data": {"init_args": unset},
              "model": {"init_args": {"model": "vit_tiny_patch16_224", "pretrained": str(tmp_path / "gone")}}}
    follow_the_weights(config)
    assert unset == {"img_size": 32, "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 0.9, "interpolation": "bilinear"}


def test_one_owner_of_the_default_mean_and_std():
    """ImageNet's for 3 channels (timm's numbers), 0.5 for any other count; a mismatch is an error naming both."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    from vit.preprocessing import Preprocessing, default_normalisation

    assert default_normalisation(3) == (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
    assert default_normalisation(1) == ((0.5,), (0.5,)) and default_normalisation(4) == ((0.5,) * 4, (0.5,) * 4)
    assert default_normalisation(2, mean=[0.1, 0.2]) == ((0.1, 0.2), (0.5, 0.5))
    with pytest.raises(ValueError, match=r"mean \[0.1\] and std \[0.5, 0.5\] need one value per input channel \(2\)"):
        default_normalisation(2, mean=[0.1])
    assert Preprocessing.for_channels(1, crop_pct=0.9) == Preprocessing((0.5,), (0.5,), 0.9, "bicubic")


def test_the_datamodule_links_one_record(tmp_path, photos):
    """The CLI links the DataModule's record into the classifier, whose checkpoint holds its fields."""
    from vit.data import ImageFolder
    from vit.preprocessing import Preprocessing

    data = ImageFolder(root=str(photos), mean=[0.1, 0.2, 0.3], crop_pct=0.8, interpolation="bilinear")
    assert data.preprocessing == Preprocessing((0.1, 0.2, 0.3), (0.229, 0.224, 0.225), 0.8, "bilinear")
