"""CLIP and SigLIP: an image tower and a text tower on the same blocks and attention kernel, scored by cosine.

    images (B, 3, H, W) -> VisionTransformer (num_classes 0) -> pool -> proj (CLIP; SigLIP: none)  (B, E)
    ids (T, L)          -> token + position embeddings                                          (T, L, W)
                        -> EncoderBlock x depth (pre-norm; causal for CLIP, bidirectional for SigLIP)
                        -> norm -> pool: the EOT token (CLIP: the highest id), the last (SigLIP)  (T, W)
                        -> text_projection (SigLIP: with a bias)                                 (T, E)
    logits (B, T) = exp(logit_scale) * cos(image, text) (+ logit_bias, SigLIP's sigmoid loss)

The API other modules build on (stable):
  * `CLIPTextConfig` (a frozen record, like `ViTConfig`) and `TextTower(config)`: ``tower(ids) -> (T, E)``.
  * `CLIP(vision: ViTConfig, text: CLIPTextConfig, logit_bias=False)`: ``.visual`` (a `VisionTransformer`),
    ``.text``, ``.logit_scale`` (log of the scale, a parameter), ``.logit_bias`` (a parameter or None),
    ``encode_image(images, normalize=False)``, ``encode_text(ids, normalize=False)``, ``forward(images, ids)``
    (logits images x texts), ``family`` ("clip" or "siglip"), ``to_dict()`` / `CLIP.from_dict` (plain values
    for a checkpoint), and ``classifier(class_embeddings)``: the image tower as an ordinary `VisionTransformer`
    whose head scores the classes (a zero-shot classifier, `vit zeroshot`; `head_init: zeroshot`).
  * Weights, tokenizers and class embeddings come from `vit.checkpoints.clip` (`load_clip`) and
    `vit.data.clip_text` (`load_tokenizer`, templates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit.nn.blocks import EncoderBlock
from vit.nn.configs import ModelConfig, ViTConfig
from vit.nn.vision import VisionTransformer, build_model

TEXT_POOLS = ("eot", "last")
TEXT_ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu")


@dataclass(frozen=True)
class CLIPTextConfig(ModelConfig):
    """CLIP's (the defaults: ViT-B's text tower) or SigLIP's text Transformer; block options named as `ViTConfig`'s.

    ``pool``: "eot" reads the end-of-text token, the highest id in each row (CLIP's); "last" the last position
    (SigLIP, padded to ``context_length``). ``causal``: each token sees those before it only (CLIP).
    """

    vocab_size: int = 49408
    context_length: int = 77
    embed_dim: int = 512  # the tower's width
    num_heads: int = 8
    depth: int = 12
    mlp_ratio: float = 4.0
    output_dim: int = 512  # text_projection's width, the joint space's (0: no projection)
    act_layer: str = "gelu"  # "quick_gelu" for OpenAI's weights, "gelu_tanh" for transformers' SigLIP
    norm_eps: float = 1e-5  # SigLIP: 1e-6
    causal: bool = True
    pool: str = "eot"
    proj_bias: bool = False  # SigLIP's projection has one
    # The block options a ViTConfig sets and these towers fix (`EncoderBlock.from_config` reads them).
    qkv_bias: ClassVar[bool] = True
    locality_attention: ClassVar[bool] = False
    init_values: ClassVar[float | None] = None
    drop_rate: ClassVar[float] = 0.0
    attn_drop_rate: ClassVar[float] = 0.0

    def __post_init__(self) -> None:
        if self.pool not in TEXT_POOLS:
            raise ValueError(f"pool must be one of {', '.join(TEXT_POOLS)}, got {self.pool!r}")
        if self.act_layer not in TEXT_ACTIVATIONS:
            raise ValueError(f"act_layer must be one of {', '.join(TEXT_ACTIVATIONS)}, got {self.act_layer!r}")


class TextTower(nn.Module):
    """The text Transformer: ids (T, L) -> embeddings (T, output_dim). Weights: ``token_embedding``,
    ``positional_embedding`` (L, W), ``blocks.i`` (the ViT's `EncoderBlock`), ``norm``, ``proj``."""

    def __init__(self, config: CLIPTextConfig) -> None:
        super().__init__()
        c = self.config = config
        self.token_embedding = nn.Embedding(c.vocab_size, c.embed_dim)
        self.positional_embedding = nn.Parameter(torch.empty(c.context_length, c.embed_dim))
        self.blocks = nn.Sequential(*[EncoderBlock.from_config(c) for _ in range(c.depth)])
        self.norm = nn.LayerNorm(c.embed_dim, eps=c.norm_eps)
        self.proj = nn.Linear(c.embed_dim, c.output_dim, bias=c.proj_bias) if c.output_dim else nn.Identity()
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.positional_embedding, std=0.01)

    def forward(self, ids: Tensor) -> Tensor:
        """Token ids (T, L), L <= context_length -> the pooled, projected text embeddings (T, output_dim)."""
        c = self.config
        if ids.dim() != 2 or ids.shape[1] > c.context_length:
            raise ValueError(f"expected token ids (texts, <= {c.context_length}), got {tuple(ids.shape)}")
        ends = ids.argmax(dim=-1) if c.pool == "eot" else None
        if ends is not None and c.causal:
            # Causal attention: no token after the last EOT reaches any EOT, so the padding is never computed.
            ids = ids[:, : int(ends.max()) + 1]
        x = self.token_embedding(ids) + self.positional_embedding[: ids.shape[1]]  # (T, L, W)
        for block in self.blocks:
            x = block(x, is_causal=c.causal)
        x = self.norm(x)
        pooled = x[:, -1] if ends is None else x[torch.arange(x.shape[0], device=x.device), ends]  # (T, W)
        return self.proj(pooled)


class CLIP(nn.Module):
    """Two towers and the scale (and SigLIP's bias) of their cosine: see the module's docstring."""

    def __init__(self, vision: ViTConfig, text: CLIPTextConfig, *, logit_bias: bool = False) -> None:
        super().__init__()
        if vision.num_classes:
            raise ValueError(f"the image tower ends in its embedding: num_classes must be 0, got {vision.num_classes}")
        out = vision.proj_dim or vision.embed_dim
        if text.output_dim and out != text.output_dim:
            raise ValueError(f"the towers' embeddings differ in width: image {out}, text {text.output_dim}")
        self.visual: VisionTransformer = build_model(vision)
        self.text = TextTower(text)
        # CLIP starts at a temperature of 0.07; SigLIP at scale 10 and bias -10 (its sigmoid loss's start).
        self.logit_scale = nn.Parameter(torch.tensor(math.log(10.0) if logit_bias else math.log(1 / 0.07)))
        self.logit_bias = nn.Parameter(torch.tensor(-10.0)) if logit_bias else None

    @property
    def family(self) -> str:
        """"siglip" (sigmoid loss: a logit bias) or "clip": the templates and tokenizer conventions."""
        return "siglip" if self.logit_bias is not None else "clip"

    def to_dict(self) -> dict[str, Any]:
        """Plain values that `CLIP.from_dict` builds the same model from (a checkpoint's)."""
        return {"vision": self.visual.config.to_dict(), "text": self.text.config.to_dict(),
                "logit_bias": self.logit_bias is not None}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Self:
        """The model `to_dict` describes, freshly initialised."""
        return cls(ViTConfig.from_dict(values["vision"]), CLIPTextConfig.from_dict(values["text"]),
                   logit_bias=bool(values.get("logit_bias")))

    def encode_image(self, images: Tensor, normalize: bool = False) -> Tensor:
        """Images (B, C, H, W) -> embeddings (B, E)."""
        v = self.visual
        x = v.forward_head(v.tokens(images, pooled_only=True), pre_logits=True)
        return F.normalize(x, dim=-1) if normalize else x

    def encode_text(self, ids: Tensor, normalize: bool = False) -> Tensor:
        """Token ids (T, L) -> embeddings (T, E)."""
        x = self.text(ids)
        return F.normalize(x, dim=-1) if normalize else x

    def forward(self, images: Tensor, ids: Tensor) -> Tensor:
        """Logits (B, T): exp(logit_scale) * cos(image, text), + logit_bias for SigLIP."""
        logits = self.logit_scale.exp() * self.encode_image(images, True) @ self.encode_text(ids, True).T
        return logits if self.logit_bias is None else logits + self.logit_bias

    def classifier(self, class_embeddings: Tensor) -> VisionTransformer:
        """The image tower as a classifier of its own whose head scores each class as `forward` scores a text.

        ``class_embeddings`` (C, E): one per class (e.g. averaged over prompt templates), normalised here. The
        model's embedding is normalised before the head, whose weight is exp(logit_scale) x the class rows and
        bias SigLIP's logit_bias (else 0): an ordinary `VisionTransformer` for every command that runs one.
        """
        rows = F.normalize(class_embeddings.detach().float(), dim=-1)
        config = self.visual.config.replace(num_classes=rows.shape[0], normalize_embedding=True)
        model = build_model(config)
        state = {k: v for k, v in self.visual.state_dict().items() if not k.startswith("head.")}
        bias = 0.0 if self.logit_bias is None else float(self.logit_bias)
        state |= {"head.weight": self.logit_scale.detach().exp() * rows,
                  "head.bias": torch.full((rows.shape[0],), bias)}
        model.load_state_dict(state)
        return model.eval()


__all__ = ["CLIP", "CLIPTextConfig", "TextTower"]
