"""Thin LoRA checkpoints (`vit.checkpoints.lora`): what they keep, how the base is named, found and checked, and the
adapters-only export."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import vit
from tests.helpers import TINY_DIM
from tests.nn.test_vision import perturb
from vit.checkpoints.lora import base_identity, completed, describe_base, export_adapters, held_names
from vit.checkpoints.weights import load_merged, read_state_dict
from vit.errors import UserPathError, UserValueError
from vit.nn.lora import LoraConfig, add_adapters, base_digest

OPTIONS = dict(depth=2, embed_dim=TINY_DIM, num_heads=2)


def test_held_names_keeps_what_trained_of_each_network_and_everything_else():
    state = {"model.a": 1, "model.b": 2, "model_ema.module.a": 3, "model_ema.module.b": 4, "other.c": 5}
    assert held_names(state, {"a"}) == {"model.a": 1, "model_ema.module.a": 3, "other.c": 5}
    full = completed(held_names(state, {"a"}), {"a": 0, "b": 9}, ("model.", "model_ema.module."))
    assert full == {"model.a": 1, "model.b": 9, "model_ema.module.a": 3, "model_ema.module.b": 9, "other.c": 5}


def test_base_identity_names_a_file_absolutely_and_a_tag_as_given(tmp_path, monkeypatch):
    (tmp_path / "w.safetensors").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    assert base_identity("w.safetensors", "ab" * 32)["path"] == str(tmp_path / "w.safetensors")
    tag = base_identity("vit_small_patch16_224.augreg_in21k", "cd" * 32)
    assert tag["path"] is None and "the tag 'vit_small_patch16_224.augreg_in21k'" in describe_base(tag)


def adapted_checkpoint(tmp_path) -> tuple[dict, torch.nn.Module]:
    """A hand-made thin checkpoint of a LoRA'd model on a base file: (checkpoint, the unmerged model)."""
    base = perturb(vit.create_model("vit_digits_patch2_8", **OPTIONS))
    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, tmp_path / "base.safetensors")
    model = perturb(vit.create_model("vit_digits_patch2_8", **OPTIONS))
    model.load_state_dict(base.state_dict())
    cfg = LoraConfig(rank=2, targets=("k", "fc2"))
    add_adapters(model, cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.1)
    held = [n for n in model.state_dict() if "lora_" in n or n.startswith("head.")]
    identity = base_identity(str(tmp_path / "base.safetensors"), base_digest(model.state_dict(), held))
    lora = {**cfg.to_dict(), "base": identity}
    meta = {"task": "classify", "ema": False, "lora": lora, "model_name": "vit_digits_patch2_8",
            "model_config": dict(model.config.to_dict()), "class_names": [str(i) for i in range(10)]}
    state = {f"model.{n}": model.state_dict()[n] for n in held}
    return {"vit": meta, "state_dict": state}, model.eval()


def test_load_merged_finds_the_base_and_refuses_another(tmp_path):
    checkpoint, adapted = adapted_checkpoint(tmp_path)
    weights = {k[len("model."):]: v for k, v in checkpoint["state_dict"].items()}
    x = torch.randn(2, 1, 8, 8)
    merged = vit.create_model("vit_digits_patch2_8", **OPTIONS).eval()
    load_merged(merged, weights, checkpoint["vit"]["lora"], "run.ckpt")
    with torch.no_grad():
        torch.testing.assert_close(merged(x), adapted(x), rtol=1e-5, atol=1e-5)
    torch.save(checkpoint, tmp_path / "run.ckpt")  # load_pretrained (vit probe, pretrained:) reads it merged
    assert torch.equal(read_state_dict(tmp_path / "run.ckpt")["blocks.0.attn.qkv.weight"],
                       merged.state_dict()["blocks.0.attn.qkv.weight"])
    other = perturb(vit.create_model("vit_digits_patch2_8", **OPTIONS), scale=0.1)
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, tmp_path / "base.safetensors")
    with pytest.raises(UserValueError, match="now holds other weights"):
        load_merged(vit.create_model("vit_digits_patch2_8", **OPTIONS), weights, checkpoint["vit"]["lora"],
                    "run.ckpt")
    (tmp_path / "base.safetensors").unlink()
    with pytest.raises(UserPathError, match=r"run.ckpt holds LoRA adapters on the file .*base.safetensors"):
        load_merged(vit.create_model("vit_digits_patch2_8", **OPTIONS), weights, checkpoint["vit"]["lora"],
                    "run.ckpt")


def test_export_adapters_writes_what_trained_and_the_settings(tmp_path):
    checkpoint, _ = adapted_checkpoint(tmp_path)
    files = export_adapters(checkpoint, "run.ckpt", tmp_path / "out")
    tensors = load_file(files[0])
    assert set(tensors) == {k[len("model."):] for k in checkpoint["state_dict"]}
    config = json.loads(files[1].read_text())
    assert config["targets"] == ["k", "fc2"] and config["rank"] == 2
    assert config["base"] == checkpoint["vit"]["lora"]["base"]
    plain = {"vit": {"task": "classify", "ema": False}, "state_dict": {}}
    with pytest.raises(UserValueError, match="holds no adapters"):
        export_adapters(plain, "plain.ckpt", tmp_path / "no")


def test_export_adapters_of_a_whole_distilled_network_keeps_both_heads_and_no_base_key(tmp_path):
    """A checkpoint that holds its base (save_base: lora.base is None): the export keeps what trained alone, the
    adapters and both heads of a distilled model (head and head_dist), and none of the base's weights."""
    model = perturb(vit.create_model("vit_digits_patch2_8", distilled=True, **OPTIONS))
    cfg = LoraConfig(rank=2, targets=("q", "v"))
    add_adapters(model, cfg)
    state = model.state_dict()
    meta = {"task": "classify", "ema": False, "lora": {**cfg.to_dict(), "base": None},
            "model_name": "vit_digits_patch2_8", "model_config": dict(model.config.to_dict()),
            "class_names": [str(i) for i in range(10)]}
    files = export_adapters({"vit": meta, "state_dict": {f"model.{k}": v for k, v in state.items()}}, "run.ckpt",
                            tmp_path / "out")
    tensors = load_file(files[0])
    heads = {"head.weight", "head.bias", "head_dist.weight", "head_dist.bias"}
    adapters = {k for k in state if ".lora_A." in k or ".lora_B." in k}
    assert adapters and heads <= set(state) and "dist_token" in state
    assert set(tensors) == adapters | heads  # no base key: not dist_token, qkv.weight, norms or the patch embedding
    assert all(torch.equal(tensors[k], state[k]) for k in tensors)
