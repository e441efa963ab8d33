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
