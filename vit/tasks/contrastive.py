"""Contrastive training of both towers on image-caption pairs: FLYP's fine-tuning of a CLIP/SigLIP on a user's
captions (Goyal et al. 2023; open_clip #1054), or a small CLIP trained from scratch.

    (images (B, C, H, W), captions (B)) ─► CLIP.encode_image / encode_text, unit length   (B, E), (B, E)
        ─► loss "clip":   InfoNCE over scale x cosines, both directions       (`vit.tasks.losses.clip_loss`)
           loss "siglip": a sigmoid per pair on scale x cosine + bias        (`vit.tasks.losses.siglip_loss`)

From scratch (``pretrained`` None) the image tower is a named `ViTConfig` (``vision``, ``vision_kwargs``) ending in a
projection to ``embed_dim``, and the text tower a `CLIPTextConfig` (``text``) that reads captions one character at
a time (`vit.data.captions.CharCaptions`: the vocabulary is fixed, so nothing is read before training), or with
``tokenizer: word`` whole words, the vocabulary the training captions' (built in ``configure_model``). With
``pretrained`` (an OpenCLIP/transformers CLIP or SigLIP, `vit.checkpoints.clip.load_clip`) both towers, the scale,
the bias and the tokenizer are the weights', read in ``configure_model`` as the classifier reads its own.

The checkpoint holds the model's configs (`CLIP.to_dict`) and the tokenizer (or the source to load it from again),
so `load_contrastive` rebuilds the model and its text side from the file alone; `zeroshot_classifier` turns them
into an ordinary classifier of named classes (with `vit zeroshot`'s class embeddings), and `zeroshot_start` loads
that classifier into `vit fit`'s network (`head_init: zeroshot`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from vit._graveyard import moved_name
from vit.checkpoints.average import TRAINING_ONLY
from vit.checkpoints.io import read_checkpoint
from vit.checkpoints.meta import META_KEY, expect_task
from vit.checkpoints.zeroshot import zeroshot_classifier
from vit.data.captions import ALPHABET, CharCaptions
from vit.errors import UserValueError
from vit.nn.clip import CLIP, CLIPTextConfig
from vit.nn.configs import named_config
from vit.nn.vision import VisionTransformer
from vit.tasks.base import BaseTask
from vit.tasks.losses import clip_loss, siglip_loss
from vit.tasks.optim import adamw, step_schedule, warmup_cosine

LOSSES = ("clip", "siglip")
SCRATCH_TOKENIZERS = ("char", "word")


class ContrastiveTask(BaseTask):
    """Both towers of a CLIP trained on (image, caption) batches (`vit.data.CaptionTable`).

    Args:
        vision: from scratch: the image tower's named config (``vit.list_models()``); vision_kwargs: its overrides.
        img_size, in_chans: the images' side and channels (from scratch; the data's).
        text: from scratch: `CLIPTextConfig` overrides (``depth``, ``embed_dim``, ``num_heads``, ...).
        embed_dim: from scratch: the joint space's width (the image projection's and the text projection's).
        context_length: from scratch: tokens per caption, <bos> and <eot> included.
        tokenizer: from scratch: "char" (a fixed alphabet) or "word" (the training captions' words; an unseen word
            reads as <unk>).
        pretrained: a CLIP or SigLIP to fine-tune (a file, a hub tag or an OpenCLIP folder): then the towers, the
            loss's scale and bias and the tokenizer are the weights', and ``vision``/``text`` are not used.
        loss: "clip" (InfoNCE, softmax over the batch) or "siglip" (a sigmoid per pair, with a learnt bias).
        lr, weight_decay, betas, warmup_epochs, min_lr: AdamW with warm-up and cosine, per step.
    """

    task = "contrastive"

    def __init__(self, vision: str = "vit_digits_patch2_8", vision_kwargs: dict[str, Any] | None = None,
                 img_size: int | None = None, in_chans: int | None = None, text: dict[str, Any] | None = None,
                 embed_dim: int = 64, context_length: int = 32, pretrained: str | None = None, loss: str = "clip",
                 lr: float = 1e-3, weight_decay: float = 0.1, betas: Sequence[float] = (0.9, 0.98),
                 warmup_epochs: float = 1.0, min_lr: float = 0.0, tokenizer: str = "char") -> None:
        if loss not in LOSSES:
            raise UserValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        if tokenizer not in SCRATCH_TOKENIZERS:
            raise UserValueError(f"tokenizer must be one of {', '.join(SCRATCH_TOKENIZERS)}, got {tokenizer!r}")
        super().__init__()

    def configure_models(self) -> None:
        """From scratch: both towers, randomly initialised; with ``pretrained``: nothing until `configure_model`."""
        hp = self.hparams
        self.clip: CLIP | None = None
        self.tokenizer: Any = None
        if hp.pretrained is None and hp.tokenizer == "char":
            self.tokenizer = CharCaptions(ALPHABET, hp.context_length)
            self.clip = scratch_clip(hp, self.tokenizer.vocab_size)

    def configure_model(self) -> None:
        """Read the ``pretrained`` CLIP, or build the word vocabulary of the training captions and the CLIP of its
        size, once (Lightning calls this inside a Trainer, after the data's setup, before the optimiser)."""
        if self.clip is not None:
            return
        if self.hparams.pretrained is None:
            captions = getattr(getattr(self.trainer, "datamodule", None), "captions", None)
            if captions is None:
                raise UserValueError("tokenizer: word builds its vocabulary from the training captions: fit with "
                                     "a caption table (vit.data.captions.CaptionTable) as the data")
            self.tokenizer = CharCaptions.words(captions("train"), self.hparams.context_length)
            self.clip = scratch_clip(self.hparams, self.tokenizer.vocab_size)
            return
        from vit.checkpoints.clip import load_clip

        loaded = load_clip(self.hparams.pretrained)
        if (loaded.model.family == "siglip") != (self.hparams.loss == "siglip"):
            raise UserValueError(f"{self.hparams.pretrained} is a {loaded.model.family.upper()} model: train it with "
                                 f"loss: {loaded.model.family}, the loss its scale and bias were learnt with")
        self.clip, self.tokenizer = loaded.model.train(), loaded.tokenizer

    # --- steps ---------------------------------------------------------------------------------
    def contrastive_loss(self, images: Tensor, captions: Sequence[str]) -> Tensor:
        """The loss of one batch of pairs."""
        ids = self.tokenizer(list(captions)).to(images.device)
        image = self.clip.encode_image(images, normalize=True)
        text = self.clip.encode_text(ids, normalize=True)
        scale = self.clip.logit_scale.clamp(max=4.6052).exp()  # at most 100, CLIP's cap
        if self.hparams.loss == "siglip":
            return siglip_loss(image, text, scale, self.clip.logit_bias)
        return clip_loss(image, text, scale)

    def training_step(self, batch: tuple[Tensor, Sequence[str]], batch_idx: int) -> Tensor:
        images, captions = batch
        loss = self.contrastive_loss(images, captions)
        self.check_loss(loss)
        self.log("train_loss", loss, prog_bar=True)
        self.log("logit_scale", self.clip.logit_scale.exp().detach())
        return loss

    def validation_step(self, batch: tuple[Tensor, Sequence[str]], batch_idx: int) -> None:
        images, captions = batch
        self.log("val_loss", self.contrastive_loss(images, captions), prog_bar=True, batch_size=len(captions))

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        named = [(n, p) for n, p in self.clip.named_parameters() if p.requires_grad]
        # open_clip's rule: no decay on gains, biases and the scalars (logit scale and bias)
        groups = [{"params": [p for n, p in named if p.ndim >= 2], "weight_decay": hp.weight_decay},
                  {"params": [p for n, p in named if p.ndim < 2], "weight_decay": 0.0}]
        optimizer = adamw(groups, lr=hp.lr, betas=tuple(hp.betas))
        warmup, total = self.schedule_steps(hp.warmup_epochs, None)
        min_ratio = self.min_lr_ratio(hp.min_lr, hp.lr)
        return step_schedule(optimizer, lambda step: warmup_cosine(step, warmup, total, min_ratio))

    # --- checkpoint ------------------------------------------------------------------------------
    def checkpoint_meta(self) -> dict[str, Any]:
        """The task, the model's configs, and the tokenizer (from scratch) or where to load it from again."""
        tokenizer = self.tokenizer.to_dict() if isinstance(self.tokenizer, CharCaptions) else None
        return {"task": self.task, "clip": self.clip.to_dict(), "tokenizer": tokenizer,
                "pretrained": self.hparams.pretrained, "in_chans": self.clip.visual.config.in_chans}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if self.clip is None:  # a fine-tune of pretrained weights: the file rebuilds the model without the source
            self.clip, self.tokenizer = rebuilt(checkpoint[META_KEY])


def scratch_clip(hp: Any, vocab_size: int) -> CLIP:
    """A randomly initialised CLIP of the task's from-scratch settings (``hp``) and a vocabulary of ``vocab_size``."""
    overrides = dict(hp.vision_kwargs or {}, num_classes=0, proj_dim=hp.embed_dim)
    overrides |= {k: hp[k] for k in ("img_size", "in_chans") if hp[k] is not None}
    text = dict(hp.text or {})
    text |= {"vocab_size": vocab_size, "context_length": hp.context_length, "output_dim": hp.embed_dim}
    return CLIP(named_config(hp.vision, **overrides), CLIPTextConfig(**text), logit_bias=hp.loss == "siglip")


def rebuilt(meta: dict[str, Any]) -> tuple[CLIP, Any]:
    """The (untrained) CLIP and the tokenizer a contrastive checkpoint's meta describes."""
    clip = CLIP.from_dict(meta["clip"])
    if meta.get("tokenizer") is not None:
        return clip, CharCaptions.from_dict(meta["tokenizer"])
    from vit.checkpoints.clip import load_clip

    return clip, load_clip(meta["pretrained"]).tokenizer


def load_contrastive(path: str | os.PathLike) -> tuple[CLIP, Any]:
    """The trained CLIP of a `ContrastiveTask` checkpoint (eval mode) and its tokenizer, without Lightning."""
    checkpoint = read_checkpoint(path)
    meta = expect_task(checkpoint, "contrastive", path)
    clip, tokenizer = rebuilt(meta)
    clip.load_state_dict({k.removeprefix("clip."): v for k, v in checkpoint["state_dict"].items()})
    return clip.eval(), tokenizer


def load_text_model(source: str | os.PathLike) -> tuple[CLIP, Any]:
    """Both towers and the tokenizer of ``source``: a `ContrastiveTask` checkpoint, or anything `load_clip` reads
    (an OpenCLIP/OpenAI/transformers file, a hub tag, an OpenCLIP folder)."""
    if Path(source).is_file() and Path(source).suffix == ".ckpt":
        return load_contrastive(source)
    from vit.checkpoints.clip import load_clip

    loaded = load_clip(source)
    return loaded.model, loaded.tokenizer


def zeroshot_start(model: VisionTransformer, source: str | os.PathLike, class_names: Sequence[str],
                   templates: str | None = None) -> None:
    """Load into ``model`` the image tower of ``source`` with a head of ``class_names``' text embeddings
    (``templates``: a named set or a file, `vit.data.clip_text.read_templates`; None: the family's): LP-FT's
    start, `head_init: zeroshot`. ``model`` must be the image tower's architecture, said in one line if not."""
    from vit.data.clip_text import read_templates

    clip, tokenizer = load_text_model(source)
    built = zeroshot_classifier(clip, tokenizer, class_names, read_templates(templates, clip.family))
    want, have = built.config.to_dict(), model.config.to_dict()
    differ = [k for k in want if k not in TRAINING_ONLY and want[k] != have.get(k)]
    if differ:
        shown = ", ".join(f"{k}: {want[k]}" for k in differ[:6])
        raise UserValueError(f"head_init: zeroshot: the model is not {source}'s image tower; set model_kwargs "
                             f"{{{shown}}} (now {', '.join(f'{k}: {have.get(k)}' for k in differ[:6])})")
    model.load_state_dict(built.state_dict())


__all__ = ["LOSSES", "ContrastiveTask", "load_contrastive", "load_text_model",
           "zeroshot_classifier", "zeroshot_start"]


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # 0.1's check_head_init, HEAD_INITS (vit/_graveyard.py)
