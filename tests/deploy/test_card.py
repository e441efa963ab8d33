"""The model card of `vit export --format hub` (`vit.deploy.card`): front matter that huggingface_hub validates,
the run's own numbers read apart from vit, the base weights' license, the calibration if there is one."""

from __future__ import annotations

import csv
import json
import re
import shutil

import pytest
import torch

from vit.commands import main


def test_the_model_card_states_the_checkpoints_temperature_and_threshold(calibrated, tmp_path):
    from huggingface_hub import ModelCard

    ckpt, _ = calibrated
    main(["export", "--ckpt", str(ckpt), "--format", "hub", "--out", str(tmp_path / "hub")])
    stored = torch.load(ckpt, map_location="cpu", weights_only=False)["confidence"]  # read apart from vit
    text = ModelCard.load(tmp_path / "hub" / "README.md").text
    assert f"temperature T = {stored['temperature']:.4f}" in text and "divide them by T" in text
    assert f"above {stored['threshold']:.4g}" in text and f'"{stored["label"]}"' in text
    assert f"validation ECE {stored['report']['before']['ece']:.4f} before" in text


def test_card_front_matter_validates_and_its_numbers_are_the_runs(fitted, hub):
    from huggingface_hub import ModelCard

    card = ModelCard.load(hub / "README.md")
    data = card.data.to_dict()
    assert data["library_name"] == "timm" and data["pipeline_tag"] == "image-classification"
    assert "license" not in data and "base_model" not in data  # trained from scratch: nothing to inherit
    rows = list(csv.DictReader((fitted / "logs" / "digits" / "version_0" / "metrics.csv").open()))
    test_acc = float([r["test_acc"] for r in rows if r["test_acc"]][-1])
    val_acc = float([r["val_acc"] for r in rows if r["val_acc"]][-1])  # one epoch: the best checkpoint's
    results = {r.metric_name: r.metric_value for r in card.data.eval_results}
    assert results["test_acc"] == test_acc and results["test_acc_top5"] > 0
    assert f"test accuracy: {test_acc:.4f}" in card.text and "validation accuracy (epoch 0" in card.text
    assert f"{val_acc:.4f}" in card.text
    assert (hub / "confusion_matrix.png").is_file() and "](confusion_matrix.png)" in card.text
    config_yaml = (fitted / "logs" / "digits" / "version_0" / "config.yaml").read_text()
    for line in config_yaml.strip().splitlines():  # as written, an absolute path cut to "…/" and its last two parts
        at = re.search(r"(?:^|(?<=[\s'\"]))/\w", line)
        if at is not None:
            path = line[at.start():].split()[0].strip("'\"")
            line = f"{line[:at.start()]}…/{'/'.join(path.split('/')[-2:])}"
        assert line in card.text, line
    assert card.text.count("not known to the run") >= 3  # intended use, limits, license, data: left to the user
    assert "Not calibrated" in card.text  # the fitted run was not calibrated: the card claims no temperature
    assert json.loads((hub / "config.json").read_text())["label_names"] == [str(i) for i in range(10)]


def test_the_card_states_the_val_acc_of_the_checkpoints_epoch_not_the_runs_last(fitted, tmp_path):
    """A run that logged val_acc 0.5 at epoch 0 and 0.8 at epoch 1: the card of the epoch-0 checkpoint says 0.5,
    that of an epoch-1 checkpoint 0.8 (metrics.csv written here by hand)."""
    from huggingface_hub import ModelCard

    checkpoint = torch.load(next((fitted / "ckpt").glob("best-*.ckpt")), map_location="cpu", weights_only=False)
    assert checkpoint["epoch"] == 0
    step = checkpoint["global_step"]
    run = tmp_path / "run"
    run.mkdir()
    with (run / "metrics.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["epoch", "step", "train_loss", "val_acc"], [0, step - 1, 2.0, ""],
                                 [0, step - 1, "", 0.5], [1, 2 * step - 1, 1.0, ""], [1, 2 * step - 1, "", 0.8]])
    for epoch, want, other in ((0, "0.5000", "0.8000"), (1, "0.8000", "0.5000")):
        ckpt = tmp_path / f"epoch{epoch}.ckpt"
        torch.save({**checkpoint, "epoch": epoch, "global_step": (epoch + 1) * step}, ckpt)
        main(["export", "--ckpt", str(ckpt), "--format", "hub", "--out", str(tmp_path / f"hub{epoch}"),
              "--run", str(run)])
        text = ModelCard.load(tmp_path / f"hub{epoch}" / "README.md").text
        assert f"- validation accuracy (epoch {epoch}, step {(epoch + 1) * step}): {want}" in text
        assert other not in text


def test_card_of_a_checkpoint_the_run_did_not_test_claims_no_test_accuracy(fitted, tmp_path):
    from huggingface_hub import ModelCard

    main(["export", "--ckpt", str(fitted / "ckpt" / "last.ckpt"), "--format", "hub", "--out", str(tmp_path)])
    card = ModelCard.load(tmp_path / "README.md")
    assert not card.data.eval_results and "not measured on this checkpoint" in card.text
    assert not (tmp_path / "confusion_matrix.png").exists()


def test_card_without_a_run_folder_says_so(fitted, tmp_path):

    ckpt = tmp_path / "alone" / "best.ckpt"
    ckpt.parent.mkdir()
    shutil.copy(next((fitted / "ckpt").glob("best-*.ckpt")), ckpt)
    main(["export", "--ckpt", str(ckpt), "--format", "hub", "--out", str(tmp_path / "out")])
    text = (tmp_path / "out" / "README.md").read_text()
    assert "No `vit fit` run folder was found" in text and "test accuracy" not in text.split("## Results")[1][:300]


@pytest.mark.parametrize("tag", ["vit_base_patch16_224.mae", "vit_base_patch16_clip_224.metaclip_2pt5b",
                                 "vit_small_patch16_dinov3.lvd1689m", "vit_base_patch16_siglip_224.webli"])
def test_license_and_base_model_come_from_the_base_weights(tag):
    from huggingface_hub import ModelCardData
    from timm.models import get_pretrained_cfg

    from vit.deploy.card import base_weights

    cfg = get_pretrained_cfg(tag)
    found = base_weights(tag)
    assert found["base_model"] == cfg.hf_hub_id
    if cfg.license in ("cc-by-nc-4.0", "apache-2.0"):  # Hub identifiers
        assert found["license"] == cfg.license
    else:  # DINOv3's own terms: the Hub's "other", named
        assert found["license"] == "other" and found["license_name"] == cfg.license
    data = ModelCardData(license=found["license"], base_model=found["base_model"])
    assert data.to_dict()["license"] == found["license"]
    assert base_weights(None) == {} and base_weights("weights/some_file.safetensors") == {}


def test_the_card_is_titled_by_model_and_run_names_the_real_architecture_and_no_local_path(fitted, hub):
    """The title was the output folder's name, the text called a dim-64 depth-4 model timm's `vit_tiny_patch16_224`,
    and the config block printed the run's absolute folders. The model's own dimensions come from the checkpoint,
    read apart from vit."""
    from huggingface_hub import ModelCard

    best = next((fitted / "ckpt").glob("best-*.ckpt"))
    stored = torch.load(best, map_location="cpu", weights_only=False)
    name = stored["hyper_parameters"]["model"]
    text = ModelCard.load(hub / "README.md").text
    title = next(line for line in text.splitlines() if line.strip())
    assert title == f"# {name} (digits)"  # the model and the run (logs/digits), not the folder
    config = json.loads((hub / "config.json").read_text())
    embed = stored["state_dict"]["model.cls_token"].shape[-1]  # the width, from the weights themselves
    assert config["model_args"]["embed_dim"] == embed and f"embed_dim={embed}" in text
    assert f"which timm builds as `{config['architecture']}` changed by config.json's `model_args`" in text
    assert f"as timm's `{config['architecture']}`" not in text
    assert str(fitted) not in text and not re.search(r"(?<![\w:/.…])/(tmp|home|Users|root|work)/", text)
    assert "…/" in text  # the config's absolute folders (the fixture's are in tmp) are cut, not left out


def test_the_card_says_when_vit_averages_in_the_mirror_and_timm_does_not(calibrated, tmp_path):
    """A stored tta "flip" is the one calibration choice that can move `vit predict`'s top class away from the
    export's under timm or transformers: the card says so, with the validation figures that chose it; a model
    without it says nothing of it."""
    from huggingface_hub import ModelCard

    ckpt, _ = calibrated
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert saved["confidence"].get("tta", "none") == "none"
    main(["export", "--ckpt", str(ckpt), "--format", "hub", "--out", str(tmp_path / "plain")])
    assert "test-time augmentation" not in ModelCard.load(tmp_path / "plain" / "README.md").text

    saved["confidence"]["tta"] = "flip"
    saved["confidence"]["report"]["tta"] = {"none": {"top1": 0.9}, "flip": {"top1": 0.925}}
    torch.save(saved, tmp_path / "flip.ckpt")
    main(["export", "--ckpt", str(tmp_path / "flip.ckpt"), "--format", "hub", "--out", str(tmp_path / "flip")])
    text = ModelCard.load(tmp_path / "flip" / "README.md").text
    assert "test-time augmentation" in text and "(0.9250 of validation images right against 0.9000)" in text
