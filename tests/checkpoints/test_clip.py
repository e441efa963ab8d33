"""`load_clip` reads both towers from OpenCLIP folders and files and from transformers' CLIPModel/SiglipModel files,
each giving its reference library's embeddings; a file or tag without a text tower, or without a tokenizer, is named."""

from __future__ import annotations

import pytest
import torch

from tests.openclip import openclip_model, write_clip_tokenizer, write_openclip_folder, write_siglip_tokenizer
from vit.checkpoints.clip import load_clip
from vit.data.clip_text import CLIPTokenizer, SigLIPTokenizer
from vit.errors import UserPathError, UserValueError

IMAGES = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))


def texts_ids(vocab: int, context: int) -> torch.Tensor:
    ids = torch.randint(1, vocab - 1, (3, context), generator=torch.Generator().manual_seed(1))
    for row, length in enumerate((4, 9, context)):
        ids[row, length - 1], ids[row, length:] = vocab - 1, 0
    return ids


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    model, cfg = openclip_model("ViT-B-32-quickgelu")
    return model, write_openclip_folder(model, cfg, tmp_path_factory.mktemp("openclip") / "clip")


def test_open_clip_folder_gives_both_towers_tokenizer_and_preprocessing(clip_folder):
    reference, folder = clip_folder
    loaded = load_clip(folder)
    assert isinstance(loaded.tokenizer, CLIPTokenizer) and loaded.model.family == "clip"
    assert loaded.model.text.config.act_layer == "quick_gelu"  # from open_clip_config.json's quick_gelu
    assert loaded.preprocessing.mean == pytest.approx((0.48145466, 0.4578275, 0.40821073))
    ids = loaded.tokenizer(["a photo of a cat.", "a dog"])
    with torch.no_grad():
        assert torch.allclose(loaded.model.encode_text(ids), reference.encode_text(ids), atol=1e-4, rtol=0)
        assert torch.allclose(loaded.model.encode_image(IMAGES), reference.encode_image(IMAGES), atol=1e-4, rtol=0)
        assert torch.allclose(loaded.model.logit_scale, reference.logit_scale)


def test_openai_pt_without_a_config_is_quick_gelu(clip_folder, tmp_path):
    """OpenAI's names in a .pt with no config beside it: QuickGELU, as OpenAI trained; the tokenizer passed."""
    reference, folder = clip_folder
    torch.save(reference.state_dict(), tmp_path / "ViT-B-32.pt")
    loaded = load_clip(tmp_path / "ViT-B-32.pt", tokenizer=folder)
    assert loaded.model.text.config.act_layer == "quick_gelu"
    ids = texts_ids(49408, 77)
    with torch.no_grad():
        assert torch.allclose(loaded.model.encode_text(ids), reference.encode_text(ids), atol=1e-4, rtol=0)


def test_siglip_open_clip_folder(tmp_path):
    model, cfg = openclip_model("ViT-B-16-SigLIP")
    loaded = load_clip(write_openclip_folder(model, cfg, tmp_path / "siglip", family="siglip"))
    assert isinstance(loaded.tokenizer, SigLIPTokenizer) and loaded.model.family == "siglip"
    assert loaded.preprocessing.mean == (0.5, 0.5, 0.5)
    ids = loaded.tokenizer(["a photo of a cat", "a tree"])
    with torch.no_grad():
        assert torch.allclose(loaded.model.encode_text(ids), model.encode_text(ids), atol=1e-4, rtol=0)
        assert torch.allclose(loaded.model.logit_bias, model.logit_bias.reshape(()))


def features(output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.pooler_output


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_transformers_files_give_transformers_embeddings(family, tmp_path):
    """transformers' CLIPModel (QuickGELU, eps 1e-5) and SiglipModel (tanh GELU, eps 1e-6, MAP head) saved as
    config.json + model.safetensors load as our CLIP; the embeddings are transformers' own."""
    from transformers import CLIPConfig, CLIPModel, SiglipConfig, SiglipModel

    torch.manual_seed(0)
    text = dict(vocab_size=99, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=16)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                  patch_size=8)
    if family == "clip":
        model = CLIPModel(CLIPConfig(text_config={**text, "eos_token_id": 98, "bos_token_id": 97},
                                     vision_config=vision, projection_dim=48))
        write_clip_tokenizer(tmp_path)
    else:
        model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
        write_siglip_tokenizer(tmp_path)
    with torch.no_grad():
        for value in model.state_dict().values():  # norms and biases away from 1 and 0, so a mix-up shows
            value.add_(0.05 * torch.randn_like(value))
    model.eval().save_pretrained(tmp_path)
    loaded = load_clip(tmp_path)
    assert loaded.model.family == family
    ids = texts_ids(99, 16) if family == "clip" else torch.randint(0, 99, (3, 16))
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want_text = features(model.get_text_features(input_ids=ids))
        want_image = features(model.get_image_features(pixel_values=images))
        assert torch.allclose(loaded.model.encode_text(ids), want_text, atol=1e-4, rtol=0)
        assert torch.allclose(loaded.model.encode_image(images), want_image, atol=1e-4, rtol=0)


def test_a_vision_only_file_is_named_in_one_line(clip_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    _, folder = clip_folder
    vision = {k: v for k, v in load_file(folder / "open_clip_model.safetensors").items() if k.startswith("visual.")}
    save_file(vision, tmp_path / "vision.safetensors")
    with pytest.raises(UserValueError, match="image tower only") as caught:
        load_clip(tmp_path / "vision.safetensors")
    assert "\n" not in str(caught.value)


def test_missing_things_are_named(clip_folder, tmp_path):
    _, folder = clip_folder
    with pytest.raises(UserValueError, match="has no text tower"):
        load_clip("vit_base_patch16_224.augreg_in21k")
    with pytest.raises(UserPathError, match="a folder without"):
        load_clip(tmp_path)
    (tmp_path / "open_clip_model.safetensors").symlink_to(folder / "open_clip_model.safetensors")
    with pytest.raises(UserPathError, match="no tokenizer file"):
        load_clip(tmp_path)


def open_clip_to_transformers(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An OpenCLIP CLIP's state dict in transformers' CLIPModel names, written out here (the test checks it by
    the two libraries' embeddings agreeing, apart from `vit`)."""
    out = {"logit_scale": sd["logit_scale"], "text_projection.weight": sd["text_projection"].T,
           "visual_projection.weight": sd["visual.proj"].T,
           "text_model.embeddings.token_embedding.weight": sd["token_embedding.weight"],
           "text_model.embeddings.position_embedding.weight": sd["positional_embedding"],
           "vision_model.embeddings.class_embedding": sd["visual.class_embedding"],
           "vision_model.embeddings.patch_embedding.weight": sd["visual.conv1.weight"],
           "vision_model.embeddings.position_embedding.weight": sd["visual.positional_embedding"]}
    norms = {"ln_final": "text_model.final_layer_norm", "visual.ln_pre": "vision_model.pre_layrnorm",
             "visual.ln_post": "vision_model.post_layernorm"}
    layer = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "attn.out_proj": "self_attn.out_proj",
             "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
    for key, value in sd.items():
        stem, _, kind = key.rpartition(".")
        if stem in norms:
            out[f"{norms[stem]}.{kind}"] = value
        elif ".resblocks." in key:
            tower, rest = key.split(".resblocks.")
            prefix = "vision_model" if tower.startswith("visual") else "text_model"
            i, name = rest.split(".", 1)
            base = f"{prefix}.encoder.layers.{i}"
            if name.startswith("attn.in_proj_"):
                for part, chunk in zip("qkv", value.chunk(3)):
                    out[f"{base}.self_attn.{part}_proj.{name.rsplit('_', 1)[1]}"] = chunk
            else:
                stem, _, kind = name.rpartition(".")
                out[f"{base}.{layer[stem]}.{kind}"] = value
    return out


def test_transformers_format_load_equals_open_clip_format_load(tmp_path):
    """One random QuickGELU CLIP written as an OpenCLIP folder and as transformers' CLIPModel files: both load to
    the same embeddings and scale."""
    from transformers import CLIPConfig, CLIPModel

    from tests.openclip import tiny_openclip

    theirs, cfg = tiny_openclip(quick_gelu=True)
    with torch.no_grad():  # norms and biases away from 1 and 0, so a mix-up shows
        for key, value in theirs.state_dict().items():
            if key.endswith("bias") or "ln_" in key:
                value.add_(0.1 * torch.randn_like(value))
    t, v = cfg["text_cfg"], cfg["vision_cfg"]
    hf = CLIPModel(CLIPConfig(projection_dim=cfg["embed_dim"], text_config=dict(
        vocab_size=t["vocab_size"], hidden_size=t["width"], intermediate_size=4 * t["width"],
        num_hidden_layers=t["layers"], num_attention_heads=t["heads"], max_position_embeddings=t["context_length"],
        hidden_act="quick_gelu", bos_token_id=49406, eos_token_id=49407), vision_config=dict(
        hidden_size=v["width"], intermediate_size=4 * v["width"], num_hidden_layers=v["layers"],
        num_attention_heads=v["width"] // v["head_width"], image_size=v["image_size"], patch_size=v["patch_size"],
        hidden_act="quick_gelu"))).eval()
    hf.load_state_dict(open_clip_to_transformers(theirs.state_dict()), strict=True)
    hf.save_pretrained(tmp_path / "hf")
    write_clip_tokenizer(tmp_path / "hf")
    write_openclip_folder(theirs, cfg, tmp_path / "oc")
    a, b = load_clip(tmp_path / "hf").model, load_clip(tmp_path / "oc").model
    ids = texts_ids(49408, 77)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        # the two libraries agree on the converted weights: the conversion above is right
        assert torch.allclose(features(hf.get_text_features(input_ids=ids)), theirs.encode_text(ids), atol=1e-4)
        assert torch.allclose(features(hf.get_image_features(pixel_values=images)), theirs.encode_image(images),
                              atol=1e-4)
        assert torch.allclose(a.encode_text(ids), b.encode_text(ids), atol=1e-4, rtol=0)
        assert torch.allclose(a.encode_image(images), b.encode_image(images), atol=1e-4, rtol=0)
        assert torch.allclose(a.logit_scale, b.logit_scale)
