"""CLIP's and SigLIP's tokenizers give the ids of the weights' own (open_clip's, transformers'), and templates."""

from __future__ import annotations

import random

import pytest
import torch

from tests.openclip import write_clip_tokenizer, write_siglip_tokenizer
from vit.data.clip_text import CLIPTokenizer, SigLIPTokenizer, check_template, load_tokenizer, read_templates
from vit.errors import UserPathError, UserValueError

WORDS = ["cat", "Dog", "CAFÉ", "naïve", "Zürich", "São Paulo", "ñandú", "Ærøskøbing", "İstanbul", "crème brûlée",
         "it's", "we'll", "they'd", "I'M", "don't", "1984", "3.14", "v2.0", "e-mail", "rock'n'roll", "猫", "東京",
         "🐱", "👍🏽", "ﬁsh", "ＡＢＣ", "“quoted”", "‘single’", "—", "…", "(a)", "[b]", "{c}", "#tag", "@user",
         "a_b", "50%", "$5", "x+y=z", "&amp;", "&lt;b&gt;bold&lt;/b&gt;", "&quot;hi&quot;", "&#39;", "&eacute;",
         "&nbsp;", "&amp;amp;", "<i>tag</i>", "Ωmega", "Привет", "مرحبا", "नमस्ते", "e\u0301", "\u00e9"]
SPACES = [" ", "  ", "\t", "\n", " \n ", ", ", ". ", "! ", "?"]


def varied_strings(n: int = 1000, seed: int = 0) -> list[str]:
    """``n`` strings of words, accents, scripts, punctuation, HTML entities and spacing; some far over 77 tokens."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.choice([1, 2, 3, 5, 8, 13]) if i % 10 else rng.choice([60, 120, 200])  # every 10th over-long
        out.append("".join(rng.choice(WORDS) + rng.choice(SPACES) for _ in range(length)))
    return out


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip_tok")
    write_clip_tokenizer(folder)
    return folder


def test_clip_tokenizer_gives_open_clips_ids_on_1000_varied_strings(clip_folder):
    from open_clip.tokenizer import SimpleTokenizer

    texts = varied_strings()
    ours = load_tokenizer(clip_folder, family="clip", context_length=77)(texts)
    theirs = SimpleTokenizer()(texts)
    differ = [t for t, a, b in zip(texts, ours, theirs) if not torch.equal(a, b)]
    assert not differ, f"{len(differ)} strings differ, e.g. {differ[:3]}"
    assert (ours[:, -1] != 0).sum() >= 90  # the over-long ones filled the context and end in <end_of_text>
    assert set(ours[ours[:, -1] != 0, -1].tolist()) == {49407}


def test_clip_tokenizer_from_tokenizer_json_is_the_same(clip_folder, tmp_path):
    """The hub's tokenizer.json (transformers' CLIPTokenizerFast) gives the same vocabulary and merges."""
    from transformers import CLIPTokenizerFast

    CLIPTokenizerFast(str(clip_folder / "vocab.json"), str(clip_folder / "merges.txt")).save_pretrained(tmp_path)
    (tmp_path / "vocab.json").unlink(missing_ok=True)
    (tmp_path / "merges.txt").unlink(missing_ok=True)
    assert (tmp_path / "tokenizer.json").is_file()
    texts = varied_strings(100, seed=1)
    a = load_tokenizer(tmp_path, family="clip", context_length=77)(texts)
    assert torch.equal(a, load_tokenizer(clip_folder, family="clip", context_length=77)(texts))


def test_siglip_tokenizer_equals_transformers_on_its_tokenizer_json(tmp_path):
    """Padded with the files' pad token to 64, truncated keeping </s>, after SigLIP's canonical clean-up."""
    from open_clip.tokenizer import basic_clean, canonicalize_text
    from transformers import PreTrainedTokenizerFast

    write_siglip_tokenizer(tmp_path)
    ours = load_tokenizer(tmp_path, family="siglip", context_length=64)
    assert isinstance(ours, SigLIPTokenizer)
    theirs = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), pad_token="</s>")
    texts = varied_strings(300, seed=2)
    want = theirs([canonicalize_text(basic_clean(t)) for t in texts], padding="max_length", max_length=64,
                  truncation=True, return_tensors="pt").input_ids
    got = ours(texts)
    assert got.shape == (300, 64) and torch.equal(got, want)
    assert (got[:, -1] == 1).all()  # padded with "</s>" (id 1), not with id 0


def test_clip_tokenizer_needs_start_and_end_tokens():
    with pytest.raises(UserValueError, match="start/end"):
        CLIPTokenizer({"a</w>": 0}, [])


def test_missing_tokenizer_files_are_named(tmp_path):
    with pytest.raises(UserPathError, match=r"vocab\.json and merges\.txt"):
        load_tokenizer(tmp_path, family="clip", context_length=77)
    with pytest.raises(UserPathError, match=r"tokenizer\.json"):
        load_tokenizer(tmp_path, family="siglip", context_length=64)


def test_templates_named_sets_files_and_placeholders(tmp_path):
    assert len(read_templates(None, "clip")) == 80 and read_templates(None, "clip")[0] == "a bad photo of a {}."
    assert len(read_templates("simple", "clip")) == 7
    assert read_templates(None, "siglip")[0] == "a photo of a {}."
    path = tmp_path / "t.txt"
    path.write_text("a {} in the wild\n\nart of the {}\n")
    assert read_templates(str(path), "clip") == ("a {} in the wild", "art of the {}")
    path.write_text("a {} in the wild\na photo\n")
    with pytest.raises(UserValueError, match=r"line 2.*exactly one \{\}"):
        read_templates(str(path), "clip")
    for bad in ("a {} and {}", "a {0}", "photo"):
        with pytest.raises(UserValueError, match="exactly one"):
            check_template(bad, "x")
    with pytest.raises(UserPathError, match="named set"):
        read_templates("nope", "clip")
