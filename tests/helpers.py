"""The small things many tests build, each in one place: a tiny ViT, a tiny ImageClassifier, a tiny MAE task, a tiny
translator of digit words, a quick Lightning trainer and a folder of random images.

Each takes keyword overrides, for a test whose assertion depends on a size (a depth, an image size); the defaults
are what is fastest to build. Each call builds a new object: nothing here is shared between tests, so a test may
change what it gets. (Fixtures live in conftest.py; writers of real dataset formats in formats.py; Lightning test
doubles that configs name by class path in dummies.py.)
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from lightning.pytorch import Trainer
from PIL import Image

import vit
from vit.data.tokenizers import WordTokenizer
from vit.nn.text import Seq2SeqTransformer
from vit.nn.vision import VisionTransformer
from vit.tasks import ImageClassifier, MaskedAutoencoder

# scikit-learn's digits: 8x8 grayscale, 2x2 patches, so 16 patch tokens and the cls token; 10 classes.
DIGITS_VIT = "vit_digits_patch2_8"
# The size of a tiny model: what is built rarely matters to a test, building it fast does. TINY_DIM is the one
# width every test's tiny model has (tests/test_layout.py holds the test files to it).
TINY_DIM = 32
TINY = {"depth": 2, "embed_dim": TINY_DIM, "num_heads": 2}


def tiny_vit(name: str = DIGITS_VIT, **overrides) -> VisionTransformer:
    """The VisionTransformer ``name`` (the digits config) at the TINY size (``overrides`` win), seeded, in eval
    mode."""
    torch.manual_seed(0)
    return vit.create_model(name, **{**TINY, **overrides}).eval()


def tiny_classifier(**kwargs) -> ImageClassifier:
    """An ImageClassifier of the digits config at the TINY size, seeded; ``model_kwargs`` are merged over TINY, the
    other ``kwargs`` are the classifier's own."""
    torch.manual_seed(0)
    model_kwargs = {**TINY, **kwargs.pop("model_kwargs", {})}
    return ImageClassifier(**{"model": DIGITS_VIT, **kwargs}, model_kwargs=model_kwargs)


def tiny_mae(**kwargs) -> MaskedAutoencoder:
    """A MaskedAutoencoder task on 8x8 grayscale images with a TINY encoder and a one-block decoder of width 16,
    seeded; ``model_kwargs`` are merged over TINY, the other ``kwargs`` over these options."""
    torch.manual_seed(0)
    model_kwargs = {**TINY, **kwargs.pop("model_kwargs", {})}
    options = dict(model=DIGITS_VIT, img_size=8, in_chans=1, decoder_dim=16, decoder_depth=1, decoder_heads=2,
                   figure_images=0)
    return MaskedAutoencoder(**{**options, **kwargs}, model_kwargs=model_kwargs)


def tiny_translator(**overrides) -> SimpleNamespace:
    """What `vit.explain.text` reads of a trained Translator (model, source_tokenizer, target_tokenizer): a word
    tokenizer of the words "0".."9" on both sides and a seeded Seq2SeqTransformer over it without dropout, in eval
    mode; ``overrides`` are the model's."""
    tok = WordTokenizer.fit([" ".join(str(i) for i in range(10))])
    torch.manual_seed(0)
    options = dict(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, embed_dim=TINY_DIM, num_heads=4,
                   num_encoder_layers=2, num_decoder_layers=2, mlp_ratio=2.0, drop_rate=0.0, max_positions=32)
    return SimpleNamespace(model=Seq2SeqTransformer(**{**options, **overrides}).eval(), source_tokenizer=tok,
                           target_tokenizer=tok)


def quick_trainer(root: Path, **kwargs) -> Trainer:
    """A CPU Trainer that writes nothing a test did not ask for (no logger, checkpoints, progress bar or summary)
    and skips the sanity check; ``kwargs`` (max_steps, callbacks, a logger, ...) win."""
    defaults = dict(default_root_dir=root, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                    log_every_n_steps=1)
    return Trainer(**{**defaults, **kwargs})


def random_images(folder: Path, n: int, size: tuple[int, int] = (8, 8), mode: str = "L", seed: int = 0,
                  name: str = "{i}.png") -> list[Path]:
    """``n`` images of uniform noise (height x width ``size``, 'L' or 'RGB'), image i drawn from seed ``seed + i``,
    written as ``folder/name.format(i=i)``; returns their paths. Class folders: ``formats.write_class_folders``."""
    folder.mkdir(parents=True, exist_ok=True)
    shape = size if mode == "L" else (*size, len(mode))
    paths = []
    for i in range(n):
        pixels = (np.random.default_rng(seed + i).random(shape) * 255).astype(np.uint8)
        paths.append(folder / name.format(i=i))
        Image.fromarray(pixels).save(paths[-1])
    return paths
