"""OpenCLIP models and folders for the CLIP/SigLIP tests, built offline with random weights (open_clip, a dev
dependency, is the reference; `vit` never imports it)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

# Named configs at a test's size: the widths, heads, patches and flags of the real ones, 2 blocks a tower.
CLIP_NAMES = ("ViT-B-32", "ViT-B-32-quickgelu", "ViT-B-16-SigLIP")


def small_config(name: str, layers: int = 2) -> dict:
    """OpenCLIP's config of ``name`` with ``layers`` blocks in each tower (the timm trunk: depth via kwargs)."""
    import open_clip

    cfg = json.loads(json.dumps(open_clip.get_model_config(name)))
    cfg["text_cfg"]["layers"] = layers
    if "timm_model_name" not in cfg["vision_cfg"]:
        cfg["vision_cfg"]["layers"] = layers
    return cfg


def openclip_model(name: str, layers: int = 2, seed: int = 0) -> tuple[torch.nn.Module, dict]:
    """A random OpenCLIP model of ``name``'s config with ``layers`` blocks (eval mode), and that config."""
    import open_clip
    from open_clip.model import CLIP, CustomTextCLIP

    torch.manual_seed(seed)
    cfg = small_config(name, layers)
    kwargs = {k: v for k, v in cfg.items() if k not in ("custom_text",)}
    if "timm_model_name" in cfg["vision_cfg"]:
        import timm

        # the timm trunk at `layers` blocks: OpenCLIP builds it by name, so shrink it through timm's kwargs
        real = timm.create_model
        open_clip.timm_model.timm.create_model = lambda *a, **k: real(*a, **{**k, "depth": layers})
        try:
            model = CustomTextCLIP(**kwargs)
        finally:
            open_clip.timm_model.timm.create_model = real
    else:
        model = CLIP(**kwargs)
    with torch.no_grad():  # OpenCLIP's init leaves norms at 1/0 and biases at 0: vary them so a mix-up shows
        for key, value in model.state_dict().items():
            if key.endswith(("bias", "norm.weight", "ln_1.weight", "ln_2.weight", "ln_final.weight")) and value.dim():
                value.add_(0.1 * torch.randn_like(value))
        if getattr(model, "logit_bias", None) is not None:
            model.logit_bias.fill_(-3.0)
    return model.eval(), cfg


def write_clip_tokenizer(folder: Path) -> None:
    """OpenCLIP's BPE vocabulary as the hub's timm repos hold it: vocab.json and merges.txt."""
    from open_clip.tokenizer import SimpleTokenizer

    tok = SimpleTokenizer()
    (folder / "vocab.json").write_text(json.dumps(tok.encoder), encoding="utf-8")
    merges = sorted(tok.bpe_ranks.items(), key=lambda kv: kv[1])
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for (a, b), _ in merges),
                                       encoding="utf-8")


def write_siglip_tokenizer(folder: Path, vocab_size: int = 300) -> None:
    """A SentencePiece (Unigram) tokenizer.json in transformers' format, trained here on a few sentences, with
    T5's end token appended and "</s>" as the pad token (as SigLIP's files name it)."""
    from tokenizers import SentencePieceUnigramTokenizer, processors

    corpus = ["a photo of a cat", "a photo of a dog", "the small red car", "a tree in the park", "an origami bird",
              "a sculpture of a horse", "a blurry photo of the large ship", "graffiti of a flower"] * 20
    tok = SentencePieceUnigramTokenizer()
    tok.train_from_iterator(corpus, vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<unk>"],
                            unk_token="<unk>", show_progress=False)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"pad_token": "</s>", "eos_token": "</s>",
                                                              "unk_token": "<unk>"}))


def write_openclip_folder(model: torch.nn.Module, cfg: dict, folder: Path, family: str = "clip") -> Path:
    """``folder`` laid out as the hub's timm/ repos: open_clip_config.json, open_clip_model.safetensors, tokenizer."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    mean, std = ((0.5,) * 3, (0.5,) * 3) if family == "siglip" else (
        (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
    (folder / "open_clip_config.json").write_text(json.dumps(
        {"model_cfg": cfg, "preprocess_cfg": {"mean": list(mean), "std": list(std)}}))
    (write_siglip_tokenizer if family == "siglip" else write_clip_tokenizer)(folder)
    return folder


def tiny_config(quick_gelu: bool = False) -> dict:
    """An OpenCLIP config of a test's size: 32x32 images, 2 blocks a tower, CLIP's real vocabulary and context."""
    return {"embed_dim": 24, "quick_gelu": quick_gelu,
            "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 16},
            "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 2}}


def tiny_openclip(seed: int = 0, quick_gelu: bool = False) -> tuple[torch.nn.Module, dict]:
    """A random OpenCLIP CLIP of `tiny_config` (eval mode), and the config."""
    from open_clip.model import CLIP

    torch.manual_seed(seed)
    cfg = tiny_config(quick_gelu)
    model = CLIP(**cfg)
    with torch.no_grad():
        model.logit_scale.fill_(2.0)  # exp(2) = 7.4: probabilities that are not all one-hot
    return model.eval(), cfg
