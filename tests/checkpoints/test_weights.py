"""Real checkpoint formats, written offline from random-weight timm and torchvision models."""

import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torchvision
from safetensors.torch import save_file
from timm.models.vision_transformer import _load_weights as timm_load_npz

import vit
from tests.conftest import free_port, subprocess_env
from tests.formats import write_hf_cache
from tests.helpers import TINY_DIM
from vit.checkpoints.convert import convert_torchvision
from vit.checkpoints.weights import read_state_dict
from vit.errors import WeightsUnavailableError


def perturbed_timm(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(name, **kwargs).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def write_npz(model: torch.nn.Module, path, big_vision: bool) -> None:
    """Write a timm ViT in the original-ViT (or big_vision) Flax layout."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    C, H = model.embed_dim, model.blocks[0].attn.num_heads
    D = C // H
    prefix = "params/" if big_vision else ""
    mha, mlp, ln2 = (0, 0, 1) if big_vision else (1, 3, 2)
    w = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),  # OIHW -> HWIO
        "embedding/bias": sd["patch_embed.proj.bias"],
        "cls": sd["cls_token"],
        ("pos_embedding" if big_vision else "Transformer/posembed_input/pos_embedding"): sd["pos_embed"],
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
        "head/kernel": sd["head.weight"].T,
        "head/bias": sd["head.bias"],
    }
    for i in range(len(model.blocks)):
        b, p = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
        a = f"{b}MultiHeadDotProductAttention_{mha}/"
        qkv_w, qkv_b = sd[p + "attn.qkv.weight"], sd[p + "attn.qkv.bias"]
        for j, n in enumerate(("query", "key", "value")):
            w[f"{a}{n}/kernel"] = qkv_w[j * C : (j + 1) * C].T.reshape(C, H, D)
            w[f"{a}{n}/bias"] = qkv_b[j * C : (j + 1) * C].reshape(H, D)
        w[f"{a}out/kernel"] = sd[p + "attn.proj.weight"].T.reshape(H, D, C)
        w[f"{a}out/bias"] = sd[p + "attn.proj.bias"]
        w[f"{b}LayerNorm_0/scale"], w[f"{b}LayerNorm_0/bias"] = sd[p + "norm1.weight"], sd[p + "norm1.bias"]
        w[f"{b}LayerNorm_{ln2}/scale"] = sd[p + "norm2.weight"]
        w[f"{b}LayerNorm_{ln2}/bias"] = sd[p + "norm2.bias"]
        for r in range(2):
            w[f"{b}MlpBlock_{mlp}/Dense_{r}/kernel"] = sd[p + f"mlp.fc{r + 1}.weight"].T
            w[f"{b}MlpBlock_{mlp}/Dense_{r}/bias"] = sd[p + f"mlp.fc{r + 1}.bias"]
    np.savez(path, **{prefix + k: v for k, v in w.items()})


@pytest.fixture(scope="module")
def x():
    torch.manual_seed(1)
    return torch.randn(2, 3, 224, 224)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "vit_small_patch16_224"])
def test_timm_files_load_and_match(name, tmp_path, x):
    theirs = perturbed_timm(name)
    sd = theirs.state_dict()
    files = [tmp_path / "model.safetensors", tmp_path / "model.pth", tmp_path / "pytorch_model.bin"]
    save_file(sd, files[0])
    torch.save(sd, files[1])
    torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}}, files[2])
    with torch.no_grad():
        expected = theirs(x)
    for path in files:
        ours = vit.create_model(name).eval()
        result = vit.load_pretrained(ours, path)
        assert not result.head_reset and not result.pos_embed_resampled
        with torch.no_grad():
            torch.testing.assert_close(ours(x), expected, atol=1e-4, rtol=1e-4)


def test_lightning_checkpoint_prefers_the_ema_weights(tmp_path):
    raw = vit.create_model("vit_digits_patch2_8")
    ema = vit.create_model("vit_digits_patch2_8")
    state = {f"model.{k}": v for k, v in raw.state_dict().items()}
    state |= {f"model_ema.module.{k}": v for k, v in ema.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "run.ckpt")
    loaded = vit.create_model("vit_digits_patch2_8")
    vit.load_pretrained(loaded, tmp_path / "run.ckpt")
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, ema.state_dict()[k]), k


@pytest.mark.slow
def test_torchvision_vit_b_16_loads_and_matches(tmp_path, x):
    torch.manual_seed(2)
    theirs = torchvision.models.vit_b_16().eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    torch.save(theirs.state_dict(), tmp_path / "vit_b_16.pth")
    ours = vit.create_model("vit_base_patch16_224").eval()
    vit.load_pretrained(ours, tmp_path / "vit_b_16.pth")
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
    assert set(convert_torchvision(theirs.state_dict())) == set(ours.state_dict())


@pytest.mark.parametrize("big_vision", [False, True])
def test_npz_loads_and_matches(big_vision, tmp_path, x):
    theirs = perturbed_timm("vit_tiny_patch16_224")
    path = tmp_path / "ViT-Ti_16.npz"
    write_npz(theirs, path, big_vision)
    # The file is in the layout timm itself reads: timm's own loader reproduces the weights.
    check = timm.create_model("vit_tiny_patch16_224").eval()
    timm_load_npz(check, str(path))
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(check.state_dict()[k], v, msg=k)
    ours = vit.create_model("vit_tiny_patch16_224").eval()
    vit.load_pretrained(ours, path)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)


def test_other_resolution_resamples_pos_embed_like_timm(tmp_path):
    theirs = perturbed_timm("vit_tiny_patch16_224")
    path = tmp_path / "model.safetensors"
    save_file(theirs.state_dict(), path)
    ours = vit.create_model("vit_tiny_patch16_224", img_size=384).eval()
    result = vit.load_pretrained(ours, path)
    assert result.pos_embed_resampled and ours.pos_embed.shape == (1, 577, 192)
    # timm's own pretrained-loading path resamples the same file the same way
    reference = timm.create_model(
        "vit_tiny_patch16_224", img_size=384, pretrained=True, pretrained_cfg_overlay={"file": str(path)}
    ).eval()
    x = torch.randn(1, 3, 384, 384)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), atol=1e-4, rtol=1e-4)


def test_other_head_stays_fresh_and_is_logged(tmp_path, caplog):
    theirs = perturbed_timm("vit_tiny_patch16_224")
    torch.save(theirs.state_dict(), tmp_path / "model.pth")
    ours = vit.create_model("vit_tiny_patch16_224", num_classes=10)
    fresh_head = ours.head.weight.clone()
    with caplog.at_level(logging.WARNING, logger="vit.checkpoints.weights"):
        result = vit.load_pretrained(ours, tmp_path / "model.pth")
    assert result.head_reset
    assert "1000 classes" in caplog.text and "freshly initialised" in caplog.text
    torch.testing.assert_close(ours.head.weight, fresh_head)
    torch.testing.assert_close(ours.blocks[3].mlp.fc1.weight, theirs.blocks[3].mlp.fc1.weight)


def test_a_lora_checkpoint_read_for_predicting_names_its_trained_head_not_a_fresh_one(tmp_path, caplog):
    """A LoRA fit from an encoder without a head (timm's num_classes=0): the fit's own log says the head starts
    fresh (it does); reading the checkpoint back (export, predict) loads the base, then the trained head, and says
    so. The head predicted with is the checkpoint's, compared by weight."""
    from tests.conftest import short_digits_run
    from vit.checkpoints.io import read_checkpoint
    from vit.checkpoints.meta import evaluated_weights
    from vit.cli.main import cli
    from vit.deploy.classifier import read_classifier

    base = vit.create_model("vit_digits_patch4_16", depth=1, embed_dim=TINY_DIM, num_heads=2)
    save_file({k: v.contiguous() for k, v in base.state_dict().items() if not k.startswith("head.")},
              tmp_path / "base.safetensors")
    with caplog.at_level(logging.WARNING, logger="vit.checkpoints.weights"):
        cli(["fit", *short_digits_run(tmp_path, steps=2), "--test_after_fit=false",
             f"--model.init_args.pretrained={tmp_path / 'base.safetensors'}",
             "--model.init_args.finetune={class_path: vit.tasks.finetune.Adapters, init_args: {rank: 2}}"])
    assert "freshly initialised" in caplog.text  # training: true
    caplog.clear()
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    with caplog.at_level(logging.WARNING, logger="vit.checkpoints.weights"):
        classifier = read_classifier(ckpt)
    assert "freshly initialised" not in caplog.text
    assert f"the trained head comes from {ckpt}" in caplog.text
    checkpoint = read_checkpoint(ckpt)
    trained = evaluated_weights(checkpoint["state_dict"], checkpoint["vit"]["ema"])["head.weight"]  # EMA's, if kept
    assert trained.abs().sum() > 0  # a head to compare (the fresh one starts at zero)
    torch.testing.assert_close(classifier.model.head.weight, trained)


def test_grayscale_model_folds_rgb_patch_embedding(tmp_path):
    theirs = perturbed_timm("vit_tiny_patch16_224")
    save_file(theirs.state_dict(), tmp_path / "model.safetensors")
    ours = vit.create_model("vit_tiny_patch16_224", in_chans=1).eval()
    vit.load_pretrained(ours, tmp_path / "model.safetensors")
    gray = torch.randn(1, 1, 224, 224)
    with torch.no_grad():  # a gray image is an RGB image with three equal channels
        torch.testing.assert_close(ours(gray), theirs(gray.expand(-1, 3, -1, -1)), atol=1e-4, rtol=1e-4)


def test_rgb_model_spreads_grayscale_patch_embedding(tmp_path):
    # The other direction: 1-channel weights in an RGB model. The convolution is linear, so the RGB model on any
    # x must give the 1-channel model's logits on x's channel mean: each channel gets a third of the weight.
    tiny = dict(depth=1, embed_dim=TINY_DIM, num_heads=2, patch_size=4, img_size=8, num_classes=3)
    torch.manual_seed(0)
    gray = vit.create_model("vit_tiny_patch16_224", in_chans=1, **tiny).eval()
    with torch.no_grad():
        for p in gray.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_file(gray.state_dict(), tmp_path / "gray.safetensors")
    rgb = vit.create_model("vit_tiny_patch16_224", in_chans=3, **tiny).eval()
    result = vit.load_pretrained(rgb, tmp_path / "gray.safetensors")
    assert "from 1 to 3 input channels" in " ".join(result.notes)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(rgb(x), gray(x.mean(1, keepdim=True)), atol=1e-5, rtol=1e-5)


def test_mismatch_lists_keys_and_changes_nothing(tmp_path):
    theirs = perturbed_timm("vit_tiny_patch16_224")
    sd = theirs.state_dict()
    sd["blocks.0.attn.q_norm.weight"] = torch.ones(64)
    del sd["blocks.1.mlp.fc2.bias"]
    torch.save(sd, tmp_path / "model.pth")
    ours = vit.create_model("vit_tiny_patch16_224")
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(ValueError, match=r"missing keys: blocks\.1\.mlp\.fc2\.bias") as err:
        vit.load_pretrained(ours, tmp_path / "model.pth")
    assert "unexpected keys: blocks.0.attn.q_norm.weight" in str(err.value)
    assert str(tmp_path / "model.pth") in str(err.value)
    for k, v in ours.state_dict().items():
        assert torch.equal(v, before[k]), k
    small = vit.create_model("vit_small_patch16_224")
    with pytest.raises(ValueError, match="shape mismatches: cls_token"):
        vit.load_pretrained(small, tmp_path / "model.pth")


def test_bad_files_are_clear_errors(tmp_path):
    model = vit.create_model("vit_tiny_patch16_224")
    with pytest.raises(FileNotFoundError, match=r"nowhere\.pth"):
        vit.load_pretrained(model, tmp_path / "nowhere.pth")
    (tmp_path / "broken.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=r"broken\.safetensors"):
        vit.load_pretrained(model, tmp_path / "broken.safetensors")
    (tmp_path / "weights.txt").write_text("hello")
    with pytest.raises(ValueError, match="unknown checkpoint suffix"):
        read_state_dict(tmp_path / "weights.txt")
    # weights_only=True refuses arbitrary pickled objects
    torch.save({"model": logging.getLogger("x")}, tmp_path / "evil.pth")
    with pytest.raises(ValueError, match=r"evil\.pth"):
        vit.load_pretrained(model, tmp_path / "evil.pth")
    with pytest.raises(FileNotFoundError, match="neither a checkpoint file nor a timm"):
        vit.load_pretrained(model, "not_a_model_name")


TIMM_NAME = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache under tmp_path, in offline mode."""
    import huggingface_hub.constants

    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.parametrize("filename", ["model.safetensors", pytest.param("pytorch_model.bin", marks=pytest.mark.slow)])
def test_timm_name_resolves_from_a_populated_cache_offline(filename, offline_hub):
    theirs = perturbed_timm("vit_tiny_patch16_224")
    write_hf_cache(offline_hub, f"timm/{TIMM_NAME}", filename, theirs.state_dict())
    ours = vit.create_model("vit_tiny_patch16_224")
    result = vit.load_pretrained(ours, TIMM_NAME)
    assert not result.head_reset and not result.notes
    for k, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    # A name without a tag resolves to timm's default tag, the same cache entry.
    again = vit.create_model("vit_tiny_patch16_224")
    vit.load_pretrained(again, "vit_tiny_patch16_224")
    assert torch.equal(again.blocks[5].attn.qkv.weight, theirs.blocks[5].attn.qkv.weight)


def test_timm_name_offline_says_to_pass_a_local_file(offline_hub):
    model = vit.create_model("vit_tiny_patch16_224")
    with pytest.raises(WeightsUnavailableError, match="pass a local file") as err:
        vit.load_pretrained(model, TIMM_NAME)
    message = str(err.value)
    assert str(offline_hub / f"models--timm--{TIMM_NAME}") in message  # where it looked
    assert f"hf download timm/{TIMM_NAME} model.safetensors" in message  # how to fill it
    assert "HF_HUB_OFFLINE=1" in message and "pretrained null" in message  # the other two ways on


def test_timm_name_with_the_hub_unreachable_fails_within_seconds(offline_hub, monkeypatch):
    """Not offline mode: the hub is a closed local port, which huggingface_hub retries for ~25 s a file."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    model = vit.create_model("vit_tiny_patch16_224")
    start = time.perf_counter()
    with pytest.raises(WeightsUnavailableError, match="unreachable") as err:
        vit.load_pretrained(model, TIMM_NAME)
    assert time.perf_counter() - start < 10
    assert "Three ways on" in str(err.value)


@pytest.mark.slow
def test_timm_name_resolves_through_hf_home_in_a_fresh_process(tmp_path):
    """The same, with the cache found the way users set it: HF_HOME and HF_HUB_OFFLINE=1 in the environment."""
    theirs = perturbed_timm("vit_tiny_patch16_224")
    write_hf_cache(tmp_path / "home" / "hub", f"timm/{TIMM_NAME}", "model.safetensors", theirs.state_dict())
    save_file(theirs.state_dict(), tmp_path / "expected.safetensors")
    code = (
        "import torch, vit; from safetensors.torch import load_file\n"
        f"m = vit.create_model('vit_tiny_patch16_224'); vit.load_pretrained(m, '{TIMM_NAME}')\n"
        f"e = load_file('{tmp_path / 'expected.safetensors'}')\n"
        "assert all(torch.equal(m.state_dict()[k], v) for k, v in e.items()); print('same weights')\n"
    )
    env = {k: v for k, v in subprocess_env().items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    done = subprocess.run([sys.executable, "-c", code], env={**env, "HF_HOME": str(tmp_path / "home"),
                          "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "same weights" in done.stdout


# ---- raw upstream layouts, each written from a timm state dict by the inverse of its mapping ----------------
SMALL = dict(depth=2, img_size=56, num_classes=0)  # a 4x4 grid at patch 14


def load_and_compare(theirs: torch.nn.Module, name: str, raw: dict, path: Path, **options
                     ) -> vit.checkpoints.weights.LoadResult:
    """Write ``raw`` to ``path``, load it into our ``name`` and check every tensor against timm's model."""
    torch.save(raw, path)
    ours = vit.create_model(name, **options).eval()
    result = vit.load_pretrained(ours, path)
    x = torch.randn(1, 3, *ours.img_size)
    with torch.no_grad():
        assert (ours.forward_features(x) - theirs.forward_features(x)).abs().max() <= 1e-5
        if theirs.num_classes:
            assert (ours(x) - theirs(x)).abs().max() <= 1e-5
    return result


@pytest.mark.parametrize("name", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_dinov2_pth_loads(name, tmp_path):
    """facebookresearch/dinov2's layout: mask_token, register_tokens, the cls row inside pos_embed."""
    theirs = perturbed_timm(name, **SMALL)
    sd = dict(theirs.state_dict())
    raw = {"mask_token": torch.zeros(1, sd["cls_token"].shape[-1])}
    if "reg_token" in sd:  # timm folded the cls row of pos_embed into cls_token: unfold it again
        row = torch.randn(1, 1, sd["cls_token"].shape[-1])
        raw |= {"register_tokens": sd.pop("reg_token"), "cls_token": sd.pop("cls_token") - row,
                "pos_embed": torch.cat([row, sd.pop("pos_embed")], dim=1)}
    load_and_compare(theirs, name, {**sd, **raw}, tmp_path / "dinov2.pth", **SMALL)


OPENAI = [("patch_embed.proj", "conv1"), ("norm_pre", "ln_pre"), ("blocks.", "transformer.resblocks."),
          ("norm1", "ln_1"), ("norm2", "ln_2"), ("attn.qkv.", "attn.in_proj_"), ("attn.proj", "attn.out_proj"),
          ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj")]


def test_openai_clip_loads_and_warns_without_quick_gelu(tmp_path, caplog):
    """OpenAI CLIP's state dict (visual.* beside the text tower): conv1, ln_pre, in_proj_, proj (no bias)."""
    options = dict(depth=2, img_size=64, embed_dim=64, num_heads=4, num_classes=32)
    theirs = perturbed_timm("vit_base_patch16_clip_quickgelu_224", **options)
    with torch.no_grad():
        theirs.head.bias.zero_()  # OpenAI's projection has none
    raw = {"token_embedding.weight": torch.randn(10, 8), "transformer.resblocks.0.ln_1.weight": torch.ones(8)}
    for key, value in theirs.state_dict().items():
        if key == "head.weight":
            raw["visual.proj"] = value.T
        elif key == "cls_token":
            raw["visual.class_embedding"] = value.flatten()
        elif key == "pos_embed":
            raw["visual.positional_embedding"] = value[0]
        elif key == "norm.weight" or key == "norm.bias":
            raw[f"visual.ln_post.{key.split('.')[1]}"] = value
        elif key != "head.bias":
            for ours, openai in OPENAI:
                key = key.replace(ours, openai)
            raw[f"visual.{key}"] = value
    with caplog.at_level(logging.WARNING):
        load_and_compare(theirs, "vit_base_patch16_clip_quickgelu_224", raw, tmp_path / "ViT-B-16.pt", **options)
    assert "QuickGELU" not in caplog.text
    gelu = vit.create_model("vit_base_patch16_clip_224", **options)
    with caplog.at_level(logging.WARNING):
        vit.load_pretrained(gelu, tmp_path / "ViT-B-16.pt")
    assert "trained with QuickGELU" in caplog.text and "quickgelu" in caplog.text


def test_open_clip_trunk_loads(tmp_path):
    """OpenCLIP's timm tower: visual.trunk.* and its projection visual.head.proj.weight."""
    options = dict(depth=2, img_size=64, embed_dim=64, num_heads=4, num_classes=0)
    theirs = perturbed_timm("vit_base_patch16_siglip_224", **options)
    raw = {f"visual.trunk.{k}": v for k, v in theirs.state_dict().items()}
    raw |= {"visual.head.proj.weight": torch.randn(16, 64), "text.token_embedding.weight": torch.randn(10, 8)}
    torch.save(raw, tmp_path / "open_clip.bin")
    ours = vit.create_model("vit_base_patch16_siglip_224", **{**options, "num_classes": 16}).eval()
    vit.load_pretrained(ours, tmp_path / "open_clip.bin")
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert (ours(x) - theirs(x) @ raw["visual.head.proj.weight"].T).abs().max() <= 1e-5


def test_deit3_gamma_names_load(tmp_path):
    """DeiT III's own checkpoints name LayerScale blocks.i.gamma_1 / gamma_2."""
    options = dict(depth=2, img_size=64, num_classes=5)
    theirs = perturbed_timm("deit3_small_patch16_224", **options)
    raw = {k.replace("ls1.gamma", "gamma_1").replace("ls2.gamma", "gamma_2"): v for k, v in theirs.state_dict().items()}
    assert "blocks.0.gamma_1" in raw
    load_and_compare(theirs, "deit3_small_patch16_224", {"model": raw}, tmp_path / "deit3.pth", **options)


def test_dinov2_tag_resolves_from_a_hand_made_cache(offline_hub):
    """By tag, offline, the cache in huggingface_hub's real layout (refs, blobs, snapshots)."""
    tag = "vit_small_patch14_dinov2.lvd142m"
    theirs = perturbed_timm("vit_small_patch14_dinov2", **SMALL)
    write_hf_cache(offline_hub, timm.models.get_pretrained_cfg(tag).hf_hub_id, "model.safetensors",
                   theirs.state_dict())
    ours = vit.create_model("vit_small_patch14_dinov2", **SMALL).eval()
    vit.load_pretrained(ours, tag)
    x = torch.randn(1, 3, 56, 56)
    with torch.no_grad():
        assert (ours.forward_features(x) - theirs.forward_features(x)).abs().max() <= 1e-5
    with pytest.raises(WeightsUnavailableError, match="pass a local file"):  # another tag: not in the cache
        vit.load_pretrained(ours, "vit_small_patch14_reg4_dinov2.lvd142m")
