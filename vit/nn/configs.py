"""What a model is: one frozen config per model (with timm's argument names for the ViT), and the named ViTs.

`ViTConfig` describes a `VisionTransformer`: `create_model(name, **overrides)`, the checkpoint (``model_config``),
the timm export, the tasks and MAE all read and write this one record; nothing rebuilds it from layer shapes.
`TextConfig` describes the text `Seq2SeqTransformer` in the same style. Both name their blocks' options alike, so
`EncoderBlock.from_config` builds a block from either. The named table is plain data: the fields each family
sets, over `ViTConfig`'s defaults (the classic 2020 ViT). Names are timm's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar, Self

POOLS = ("token", "avg", "map", "token_avg")
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu")
TEXT_ACTIVATIONS = ("gelu", "relu")


class ModelConfig:
    """What both configs share: plain values in and out (a checkpoint's), and copies with changes."""

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Self:
        """A config from (a checkpoint's) keyword values; an unknown key is an error that lists the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown model option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(known))}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (what a checkpoint stores and `from_dict` reads back)."""
        return asdict(self)

    def replace(self, **changes: Any) -> Self:
        return replace(self, **changes) if changes else self


@dataclass(frozen=True)
class ViTConfig(ModelConfig):
    """Every option that shapes a VisionTransformer's weights or forward pass, with timm's names."""

    img_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    # --- tokens: [cls] [dist] [registers] patches ---
    class_token: bool = True
    reg_tokens: int = 0  # DINOv2's registers, DINOv3's storage tokens (`reg_token`, (1, n, D))
    distilled: bool = False  # DeiT's `dist_token` and `head_dist` (DistilledVisionTransformer)
    no_embed_class: bool = False  # pos_embed covers the patches only: add, then prepend the prefix tokens
    pos_embed: str = "learn"  # "learn", or "none" (positions from `rope` only)
    rope: str | None = None  # "dinov3": rotary positions in every attention (vit/nn/rope.py)
    rope_temperature: float = 100.0
    # --- blocks ---
    init_values: float | None = None  # LayerScale (`ls1.gamma`, `ls2.gamma`) when set
    act_layer: str = "gelu"  # "gelu", "gelu_tanh" (SigLIP2) or "quick_gelu" (OpenAI CLIP)
    norm_eps: float = 1e-6  # every LayerNorm's eps (CLIP, DINOv3: 1e-5)
    pre_norm: bool = False  # `norm_pre` after the embedding, and a patch conv without bias (CLIP)
    # --- head ---
    # "token" (cls), "avg" (patch mean), "map" (SigLIP's attention pool) or "token_avg": the cls token beside the
    # patch mean, (B, 2D), DINOv2's linear evaluation (its MODEL_CARD.md); not in timm
    global_pool: str = "token"
    final_norm: bool = True
    fc_norm: bool | None = None  # norm after pooling instead of before; None: on for "avg" (timm's rule)
    # CLIP/SigLIP image embedding before the head (`vit.nn.clip`): a bias-free projection into the joint
    # image-text space (`proj.weight`, 0: none), then with `normalize_embedding` unit length, so a head of
    # text embeddings scores cosines (a zero-shot classifier, `vit zeroshot`). Not in timm.
    proj_dim: int = 0
    normalize_embedding: bool = False
    # --- training and input ---
    drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    dynamic_img_size: bool = False
    shifted_patches: bool = False  # SPT (Lee et al., 2021); not in timm
    locality_attention: bool = False  # LSA (Lee et al., 2021); not in timm

    def __post_init__(self) -> None:
        if self.global_pool not in POOLS:
            raise ValueError(f"global_pool must be one of {', '.join(POOLS)}, got {self.global_pool!r}")
        if self.global_pool in ("token", "token_avg") and not self.class_token:
            raise ValueError(f"global_pool={self.global_pool!r} reads the cls token: set class_token=True or pool "
                             "'avg'/'map'")
        if self.global_pool == "token_avg" and self.fc_norm:
            raise ValueError("global_pool='token_avg' joins two normalised tokens: it takes no fc_norm")
        if self.act_layer not in ACTIVATIONS:
            raise ValueError(f"act_layer must be one of {', '.join(ACTIVATIONS)}, got {self.act_layer!r}")
        if self.pos_embed not in ("learn", "none"):
            raise ValueError(f"pos_embed must be 'learn' or 'none', got {self.pos_embed!r}")
        if self.rope not in (None, "dinov3"):
            raise ValueError(f"rope must be None or 'dinov3', got {self.rope!r}")
        if self.proj_dim < 0:
            raise ValueError(f"proj_dim must be 0 (no projection) or a width, got {self.proj_dim}")
        if self.depth < 1:
            raise ValueError(f"depth must be at least 1, got {self.depth}")
        if self.distilled and (self.global_pool != "token" or not self.class_token):
            raise ValueError("a distilled model's heads read the cls and dist tokens: global_pool must be 'token'")

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: cls, dist, registers."""
        return int(self.class_token) + int(self.distilled) + self.reg_tokens

    @property
    def use_fc_norm(self) -> bool:
        return self.global_pool == "avg" if self.fc_norm is None else self.fc_norm


@dataclass(frozen=True)
class TextConfig(ModelConfig):
    """Every option of the text encoder-decoder `Seq2SeqTransformer` (Vaswani et al., 2017).

    Args:
        src_vocab_size: source vocabulary size.
        tgt_vocab_size: target vocabulary size (also the output layer's).
        embed_dim: width of every token (the paper's d_model).
        num_heads: attention heads per layer.
        num_encoder_layers: encoder blocks.
        num_decoder_layers: decoder blocks.
        mlp_ratio: MLP hidden width / embed_dim.
        drop_rate: dropout on embeddings and residual branches.
        attn_drop_rate: dropout on attention weights.
        activation: the MLP's activation, "relu" (the paper's) or "gelu".
        norm_eps: LayerNorm epsilon.
        norm_first: pre-norm blocks (True) or the paper's post-norm (False).
        learned_positions: learned position embeddings instead of sinusoidal ones.
        max_positions: longest sequence the positions cover.
        share_embeddings: one token table for source and target (needs one vocabulary).
        pad_id: the padding token's id (the tokenizer's): its embedding is zero, it is masked as a key, and
            decoding pads finished rows with it.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    embed_dim: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    mlp_ratio: float = 4.0
    drop_rate: float = 0.1
    attn_drop_rate: float = 0.0
    activation: str = "relu"
    norm_eps: float = 1e-5
    norm_first: bool = True
    learned_positions: bool = False
    max_positions: int = 512
    share_embeddings: bool = False
    pad_id: int = 0
    # The block options a ViTConfig sets and the text model fixes: biased q/k/v, no LSA, no LayerScale.
    qkv_bias: ClassVar[bool] = True
    locality_attention: ClassVar[bool] = False
    init_values: ClassVar[float | None] = None

    def __post_init__(self) -> None:
        if self.activation not in TEXT_ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(TEXT_ACTIVATIONS)}, got {self.activation!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_embeddings needs one vocabulary for both sides, got source size "
                f"{self.src_vocab_size} and target size {self.tgt_vocab_size}"
            )

    @property
    def act_layer(self) -> str:
        """The activation under the name the blocks read (`ViTConfig.act_layer`)."""
        return self.activation


# The families: each the fields it sets over the defaults. `create_model(name, **overrides)` builds them.
_S, _B, _L = (dict(embed_dim=384, depth=12, num_heads=6), dict(embed_dim=768, depth=12, num_heads=12),
              dict(embed_dim=1024, depth=24, num_heads=16))
# num_classes as timm builds each family by default: 0 (features) for the self-supervised and SigLIP towers
_DINOV2 = dict(img_size=518, patch_size=14, init_values=1e-5, num_classes=0)  # LayerScale; built at 518, as timm
_REG4 = dict(reg_tokens=4, no_embed_class=True)
_CLIP = dict(pre_norm=True, norm_eps=1e-5)
_QUICK = dict(act_layer="quick_gelu")  # timm's head is OpenAI's 512-wide projection
_SIGLIP = dict(class_token=False, global_pool="map", num_classes=0)
_DEIT3 = dict(no_embed_class=True, init_values=1e-6)
_DINOV3 = dict(img_size=256, patch_size=16, num_classes=0, qkv_bias=False, init_values=1e-5, reg_tokens=4,
               pos_embed="none", rope="dinov3", global_pool="avg", fc_norm=False, norm_eps=1e-5, dynamic_img_size=True)

MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "vit_tiny_patch16_224": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "vit_small_patch16_224": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_224": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
    "vit_base_patch32_224": dict(patch_size=32, embed_dim=768, depth=12, num_heads=12),
    "vit_large_patch16_224": dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16),
    "vit_small_patch16_384": dict(img_size=384, patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_384": dict(img_size=384, patch_size=16, embed_dim=768, depth=12, num_heads=12),
    # DINOv2 (Oquab et al., 2023), and with 4 registers (Darcet et al., 2024)
    "vit_small_patch14_dinov2": dict(**_DINOV2, **_S),
    "vit_base_patch14_dinov2": dict(**_DINOV2, **_B),
    "vit_large_patch14_dinov2": dict(**_DINOV2, **_L),
    "vit_small_patch14_reg4_dinov2": dict(**_DINOV2, **_REG4, **_S),
    "vit_base_patch14_reg4_dinov2": dict(**_DINOV2, **_REG4, **_B),
    "vit_large_patch14_reg4_dinov2": dict(**_DINOV2, **_REG4, **_L),
    # DINOv3 (Siméoni et al., 2025): timm's Eva, here the same blocks with rotary positions
    "vit_small_patch16_dinov3": dict(**_DINOV3, **_S),
    "vit_base_patch16_dinov3": dict(**_DINOV3, **_B),
    "vit_large_patch16_dinov3": dict(**_DINOV3, **_L),
    # ... with q and v biases (timm's q_bias / v_bias; loaded as one qkv.bias with a zero key part)
    "vit_small_patch16_dinov3_qkvb": dict(_DINOV3, qkv_bias=True, **_S),
    "vit_base_patch16_dinov3_qkvb": dict(_DINOV3, qkv_bias=True, **_B),
    "vit_large_patch16_dinov3_qkvb": dict(_DINOV3, qkv_bias=True, **_L),
    # CLIP / OpenCLIP image towers; QuickGELU for OpenAI's and MetaCLIP's weights
    "vit_base_patch16_clip_224": dict(patch_size=16, **_CLIP, **_B),
    "vit_base_patch32_clip_224": dict(patch_size=32, **_CLIP, **_B),
    "vit_large_patch14_clip_224": dict(patch_size=14, **_CLIP, **_L),
    "vit_base_patch16_clip_quickgelu_224": dict(patch_size=16, num_classes=512, **_QUICK, **_CLIP, **_B),
    "vit_base_patch32_clip_quickgelu_224": dict(patch_size=32, num_classes=512, **_QUICK, **_CLIP, **_B),
    # SigLIP / SigLIP2: no cls token, attention-pool head; the _gap_ variant averages with no head norm
    "vit_base_patch16_siglip_224": dict(patch_size=16, **_SIGLIP, **_B),
    "vit_base_patch16_siglip_256": dict(img_size=256, patch_size=16, **_SIGLIP, **_B),
    "vit_base_patch16_siglip_gap_224": dict(patch_size=16, class_token=False, global_pool="avg", fc_norm=False,
                                            num_classes=0, **_B),
    # DeiT III (Touvron et al., 2022): LayerScale, pos_embed without the cls row
    "deit3_small_patch16_224": dict(patch_size=16, **_DEIT3, **_S),
    "deit3_base_patch16_224": dict(patch_size=16, **_DEIT3, **_B),
    # DeiT distilled (Touvron et al., 2021): a dist token and its head
    "deit_tiny_distilled_patch16_224": dict(patch_size=16, distilled=True, embed_dim=192, depth=12, num_heads=3),
    "deit_small_distilled_patch16_224": dict(patch_size=16, distilled=True, **_S),
    "deit_base_distilled_patch16_224": dict(patch_size=16, distilled=True, **_B),
    # 32x32 CIFAR, after "Vision Transformer for Small-Size Datasets" (Lee et al., 2021).
    "vit_cifar_patch4_32": dict(
        img_size=32, patch_size=4, num_classes=10, embed_dim=192, depth=9, num_heads=12, mlp_ratio=2.0
    ),
    # From scratch on a small folder of your own (configs/scratch_small.yaml, scripts/experiments/parity.py): 16
    # patches.
    "vit_scratch_patch8_32": dict(img_size=32, patch_size=8, embed_dim=96, depth=4, num_heads=4),
    # scikit-learn's 8x8 grayscale digits: 16 patches of 2x2 ...
    "vit_digits_patch2_8": dict(
        img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=64, depth=4, num_heads=4,
        mlp_ratio=2.0,
    ),
    # ... or upsampled to 16x16: still 16 patches, each 4x4 (configs/digits.yaml).
    "vit_digits_patch4_16": dict(
        img_size=16, patch_size=4, in_chans=1, num_classes=10, embed_dim=64, depth=4, num_heads=4,
        mlp_ratio=2.0,
    ),
}


def list_models() -> list[str]:
    """Names accepted by `create_model`."""
    return sorted(MODEL_CONFIGS)


def named_config(name: str, **overrides: Any) -> ViTConfig:
    """The named configuration with ``overrides``; an unknown name or option is an error that lists the known."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    known = {f.name for f in fields(ViTConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for {name}; accepted: {', '.join(sorted(known))}")
    return ViTConfig(**{**MODEL_CONFIGS[name], **overrides})
