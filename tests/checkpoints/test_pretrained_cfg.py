"""What a pretrained source says its images went through (`vit.checkpoints.pretrained_cfg`): timm's table, a `vit`
checkpoint's record, a hub folder's config.json, and nothing for a file that says nothing."""

from __future__ import annotations

import json

import torch
from timm.models import get_pretrained_cfg

from vit.checkpoints.pretrained_cfg import pretrained_preprocessing


def test_a_timm_tag_gives_timms_pretrained_cfg():
    cfg = get_pretrained_cfg("vit_small_patch14_dinov2.lvd142m")
    values, origin = pretrained_preprocessing("vit_small_patch14_dinov2.lvd142m")
    assert values == {"img_size": cfg.input_size[-1], "mean": tuple(cfg.mean), "std": tuple(cfg.std),
                      "crop_pct": cfg.crop_pct, "interpolation": cfg.interpolation}
    assert origin == "timm's pretrained_cfg of vit_small_patch14_dinov2.lvd142m"


def test_a_vit_checkpoint_gives_its_runs_record(tmp_path):
    meta = {"task": "classify", "mean": [0.5], "std": [0.25], "crop_pct": 0.9, "interpolation": "bilinear",
            "model_config": {"img_size": [8, 8]}}
    torch.save({"vit": meta, "state_dict": {}}, tmp_path / "run.ckpt")
    values, origin = pretrained_preprocessing(str(tmp_path / "run.ckpt"))
    assert values == {"mean": (0.5,), "std": (0.25,), "crop_pct": 0.9, "interpolation": "bilinear", "img_size": 8}
    assert origin == "the classify checkpoint run.ckpt"


def test_a_file_that_says_nothing_falls_back_to_its_architecture_or_to_none(tmp_path):
    (tmp_path / "torn.ckpt").write_bytes(b"not a zip")  # unreadable: says nothing, no error here
    torch.save({"weight": torch.zeros(1)}, tmp_path / "plain.pth")
    for name in ("torn.ckpt", "plain.pth"):
        assert pretrained_preprocessing(str(tmp_path / name)) is None
    values, origin = pretrained_preprocessing(str(tmp_path / "plain.pth"), "vit_small_patch16_224")
    assert values["mean"] == tuple(get_pretrained_cfg("vit_small_patch16_224").mean)
    assert "the default of the architecture vit_small_patch16_224 (plain.pth names none of its own)" in origin


def test_a_hub_folder_gives_its_config_jsons_pretrained_cfg(tmp_path):
    cfg = {"input_size": [3, 32, 32], "mean": [0.1, 0.2, 0.3], "std": [0.4, 0.5, 0.6], "crop_pct": 0.875,
           "interpolation": "bicubic"}
    (tmp_path / "config.json").write_text(json.dumps({"pretrained_cfg": cfg}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    values, _ = pretrained_preprocessing(str(tmp_path / "model.safetensors"))
    assert values == {"img_size": 32, "mean": (0.1, 0.2, 0.3), "std": (0.4, 0.5, 0.6), "crop_pct": 0.875,
                      "interpolation": "bicubic"}
