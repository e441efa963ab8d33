"""The text side of CLIP and SigLIP: tokenizers that give the weights' own ids, and prompt templates.

* `CLIPTokenizer`: OpenAI's byte-level BPE as OpenCLIP runs it: the text cleaned (HTML entities unescaped, a light
  ftfy: NFC, straight quotes, ligatures and full-width forms; whitespace collapsed), lower-cased, split by CLIP's
  pattern, BPE'd with ``</w>`` word ends; ``<start_of_text>`` ids ``<end_of_text>``, cut to 77 (the last kept id
  becomes the end) and padded with 0. The vocabulary and merges come from the folder's ``tokenizer.json`` or
  ``vocab.json`` + ``merges.txt``; the `tokenizers` library runs the BPE.
* `SigLIPTokenizer`: the folder's ``tokenizer.json`` (SentencePiece, in `tokenizers`' format) after OpenCLIP's
  "canonicalize" clean-up (punctuation removed, lower-cased), truncated and padded to 64 with its pad token, as
  it was trained (SigLIP pools the last position).
* Templates: named sets (`TEMPLATES`: OpenAI's 80 ImageNet prompts, their 7-prompt ensemble, a short generic set),
  or a user's file, one template a line, each with one ``{}`` where the class name goes.

Both tokenizers map a list of texts to ids (T, context_length) with ``tokenizer(texts)``.
"""

from __future__ import annotations

import html
import json
import os
import string
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from vit.errors import UserPathError, UserValueError

# CLIP's pre-tokenisation (OpenAI's, OpenCLIP's): contractions, letter runs, single digits, other symbol runs.
CLIP_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
CLIP_SPECIALS = (("<start_of_text>", "<end_of_text>"), ("<|startoftext|>", "<|endoftext|>"))  # OpenCLIP's, HF's
# A light ftfy (OpenCLIP runs ftfy.fix_text): curly quotes straightened, ligatures spelled out.
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u201c": '"',
                         "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2032": "'", "\u2033": '"'})
_LIGATURES = str.maketrans({"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl",
                            "\ufb05": "st", "\ufb06": "st", "\u0132": "IJ", "\u0133": "ij"})


def fix_text(text: str) -> str:
    """What ftfy's defaults change in ordinary text: HTML entities (if no tag), full-width forms, ligatures, curly
    quotes, line breaks, control characters, NFC. Mojibake repair is left out."""
    if "<" not in text:
        text = html.unescape(text)
    text = "".join(unicodedata.normalize("NFKC", ch) if 0xFF01 <= ord(ch) <= 0xFF5E or ch == "\u3000" else ch
                   for ch in text)
    text = text.translate(_LIGATURES).translate(_QUOTES).replace("\r\n", "\n").replace("\r", "\n")
    text = "".join(ch for ch in text if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf"))
    return unicodedata.normalize("NFC", text)


def basic_clean(text: str) -> str:
    """OpenCLIP's first clean-up: fix the text, unescape HTML twice, strip."""
    return html.unescape(html.unescape(fix_text(text))).strip()


def canonicalize(text: str) -> str:
    """SigLIP's (big_vision's) canonical text: underscores as spaces, no punctuation, lower case, one space."""
    text = basic_clean(text).replace("_", " ").translate(str.maketrans("", "", string.punctuation)).lower()
    return " ".join(text.split())


class TextTokenizer:
    """Texts -> ids (T, context_length): ``tokenizer(["a photo of a cat."])``."""

    family = ""

    def __init__(self, context_length: int) -> None:
        self.context_length = context_length

    def __call__(self, texts: str | Sequence[str]) -> Tensor:
        raise NotImplementedError


class CLIPTokenizer(TextTokenizer):
    """OpenAI CLIP's BPE from its vocabulary and merges; see the module's docstring."""

    family = "clip"

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], context_length: int = 77) -> None:
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers

        super().__init__(context_length)
        specials = next((s for s in CLIP_SPECIALS if s[0] in vocab and s[1] in vocab), None)
        if specials is None:
            raise UserValueError(f"the CLIP vocabulary has no start/end tokens (looked for {CLIP_SPECIALS})")
        self.sot_id, self.eot_id = vocab[specials[0]], vocab[specials[1]]
        self.bpe = Tokenizer(models.BPE(vocab, merges, end_of_word_suffix="</w>"))
        self.bpe.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(CLIP_PATTERN), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])

    def clean(self, text: str) -> str:
        return " ".join(basic_clean(text).split()).lower()

    def __call__(self, texts: str | Sequence[str]) -> Tensor:
        texts = [texts] if isinstance(texts, str) else list(texts)
        encoded = self.bpe.encode_batch([self.clean(t) for t in texts], add_special_tokens=False)
        ids = torch.zeros(len(texts), self.context_length, dtype=torch.long)
        for row, enc in enumerate(encoded):
            tokens = [*[self.sot_id, *enc.ids][: self.context_length - 1], self.eot_id]
            ids[row, : len(tokens)] = torch.tensor(tokens)
        return ids


class SigLIPTokenizer(TextTokenizer):
    """A SentencePiece ``tokenizer.json`` after SigLIP's clean-up, truncated and padded to the context."""

    family = "siglip"

    def __init__(self, path: str | os.PathLike, pad_token: str | None = None, context_length: int = 64) -> None:
        from tokenizers import Tokenizer

        super().__init__(context_length)
        self.tokenizer = Tokenizer.from_file(str(path))
        pad_id = self.tokenizer.token_to_id(pad_token) if pad_token else None
        if pad_id is None:
            padding = self.tokenizer.padding or {}
            pad_id, pad_token = padding.get("pad_id", 0), padding.get("pad_token", self.tokenizer.id_to_token(0))
        self.tokenizer.enable_truncation(max_length=context_length)
        self.tokenizer.enable_padding(length=context_length, pad_id=pad_id, pad_token=pad_token)

    def __call__(self, texts: str | Sequence[str]) -> Tensor:
        texts = [texts] if isinstance(texts, str) else list(texts)
        encoded = self.tokenizer.encode_batch([canonicalize(t) for t in texts])
        return torch.tensor([e.ids for e in encoded], dtype=torch.long).reshape(len(texts), self.context_length)


def load_tokenizer(folder: str | os.PathLike, *, family: str, context_length: int) -> TextTokenizer:
    """The tokenizer in ``folder`` (the weights' folder, or a tokenizer file) for a "clip" or "siglip" model."""
    folder = Path(folder)
    files = folder.parent if folder.is_file() else folder
    tokenizer_json = folder if folder.is_file() and folder.suffix == ".json" else files / "tokenizer.json"
    if family == "siglip":
        if not tokenizer_json.is_file():
            raise UserPathError(f"no tokenizer file for this SigLIP model: expected {tokenizer_json} (the hub repo's "
                                "tokenizer.json); pass --tokenizer FILE")
        return SigLIPTokenizer(tokenizer_json, _pad_token(files), context_length)
    if (files / "vocab.json").is_file() and (files / "merges.txt").is_file():
        vocab = json.loads((files / "vocab.json").read_text(encoding="utf-8"))
        lines = (files / "merges.txt").read_text(encoding="utf-8").splitlines()
        merges = [tuple(line.split()) for line in lines if line and not line.startswith("#version")]
    elif tokenizer_json.is_file():
        model = json.loads(tokenizer_json.read_text(encoding="utf-8"))["model"]
        vocab = model["vocab"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    else:
        raise UserPathError(f"no tokenizer file for this CLIP model in {files}: expected tokenizer.json, or vocab.json "
                            "and merges.txt (the hub repo's tokenizer files); pass --tokenizer FOLDER")
    return CLIPTokenizer(vocab, merges, context_length)  # type: ignore[arg-type]


def _pad_token(folder: Path) -> str | None:
    """The pad token transformers' files name (tokenizer_config.json, special_tokens_map.json), if any."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if path.is_file():
            pad = json.loads(path.read_text(encoding="utf-8")).get("pad_token")
            if pad:
                return pad["content"] if isinstance(pad, dict) else str(pad)
    return None


# ---------------------------------------------------------------------------- templates

# OpenAI's 80 ImageNet prompts and their 7-prompt ensemble (CLIP's "Prompt_Engineering_for_ImageNet" notebook).
OPENAI_IMAGENET = (
    'a bad photo of a {}.', 'a photo of many {}.', 'a sculpture of a {}.', 'a photo of the hard to see {}.',
    'a low resolution photo of the {}.', 'a rendering of a {}.', 'graffiti of a {}.', 'a bad photo of the {}.',
    'a cropped photo of the {}.', 'a tattoo of a {}.', 'the embroidered {}.', 'a photo of a hard to see {}.',
    'a bright photo of a {}.', 'a photo of a clean {}.', 'a photo of a dirty {}.', 'a dark photo of the {}.',
    'a drawing of a {}.', 'a photo of my {}.', 'the plastic {}.', 'a photo of the cool {}.',
    'a close-up photo of a {}.', 'a black and white photo of the {}.', 'a painting of the {}.',
    'a painting of a {}.', 'a pixelated photo of the {}.', 'a sculpture of the {}.', 'a bright photo of the {}.',
    'a cropped photo of a {}.', 'a plastic {}.', 'a photo of the dirty {}.', 'a jpeg corrupted photo of a {}.',
    'a blurry photo of the {}.', 'a photo of the {}.', 'a good photo of the {}.', 'a rendering of the {}.',
    'a {} in a video game.', 'a photo of one {}.', 'a doodle of a {}.', 'a close-up photo of the {}.',
    'a photo of a {}.', 'the origami {}.', 'the {} in a video game.', 'a sketch of a {}.', 'a doodle of the {}.',
    'a origami {}.', 'a low resolution photo of a {}.', 'the toy {}.', 'a rendition of the {}.',
    'a photo of the clean {}.', 'a photo of a large {}.', 'a rendition of a {}.', 'a photo of a nice {}.',
    'a photo of a weird {}.', 'a blurry photo of a {}.', 'a cartoon {}.', 'art of a {}.', 'a sketch of the {}.',
    'a embroidered {}.', 'a pixelated photo of a {}.', 'itap of the {}.', 'a jpeg corrupted photo of the {}.',
    'a good photo of a {}.', 'a plushie {}.', 'a photo of the nice {}.', 'a photo of the small {}.',
    'a photo of the weird {}.', 'the cartoon {}.', 'art of the {}.', 'a drawing of the {}.',
    'a photo of the large {}.', 'a black and white photo of a {}.', 'the plushie {}.', 'a dark photo of a {}.',
    'itap of a {}.', 'graffiti of the {}.', 'a toy {}.', 'itap of my {}.', 'a photo of a cool {}.',
    'a photo of a small {}.', 'a tattoo of the {}.',
)
OPENAI_SIMPLE = ('itap of a {}.', 'a bad photo of the {}.', 'a origami {}.', 'a photo of the large {}.',
                 'a {} in a video game.', 'art of the {}.', 'a photo of the small {}.')
GENERIC = ("a photo of a {}.", "a photo of the {}.", "a picture of a {}.", "an image of a {}.")
TEMPLATES = {"openai": OPENAI_IMAGENET, "simple": OPENAI_SIMPLE, "generic": GENERIC, "photo": ("a photo of a {}.",)}
DEFAULT_TEMPLATES = {"clip": "openai", "siglip": "generic"}  # SigLIP scores one prompt well; averaging 80 is slow


def check_template(template: str, where: str) -> str:
    """``template`` if it has exactly one ``{}`` (where the class name goes), else the error naming it."""
    if template.count("{}") != 1 or template.replace("{}", "").count("{") or template.replace("{}", "").count("}"):
        raise UserValueError(f"{where}: template {template!r} needs exactly one {{}} where the class name goes, "
                             "e.g. 'a photo of a {}.'")
    return template


def read_templates(spec: str | None, family: str) -> tuple[str, ...]:
    """The templates ``spec`` names (a set in `TEMPLATES`, or a file, one a line), the family's default if None."""
    spec = spec or DEFAULT_TEMPLATES[family]
    if spec in TEMPLATES:
        return TEMPLATES[spec]
    path = Path(spec)
    if not path.is_file():
        raise UserPathError(f"--templates {spec}: neither a file nor a named set ({', '.join(TEMPLATES)})")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    templates = tuple(check_template(t, f"{path}, line {i}") for i, t in enumerate(lines, 1) if t)
    if not templates:
        raise UserValueError(f"{path} holds no template: write one a line, e.g. 'a photo of a {{}}.'")
    return templates


__all__ = ["TEMPLATES", "CLIPTokenizer", "SigLIPTokenizer", "TextTokenizer", "load_tokenizer", "read_templates"]
