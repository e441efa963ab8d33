"""Neural-network modules: the attention kernel, Transformer blocks, the ViT and the text model."""

from vit.nn.attention import KVCache, MultiHeadAttention
from vit.nn.blocks import DecoderBlock, DropPath, EncoderBlock, LayerScale, Mlp, QuickGELU
from vit.nn.configs import TextConfig, ViTConfig
from vit.nn.layers import AttentionPool
from vit.nn.pyramid import SimpleFeaturePyramid
from vit.nn.rope import DinoV3Rope
from vit.nn.vision import (
    MODEL_CONFIGS,
    DistilledVisionTransformer,
    PatchEmbed,
    ShiftedPatchEmbed,
    VisionTransformer,
    build_model,
    create_model,
    list_models,
)

__all__ = [
    "MODEL_CONFIGS",
    "AttentionPool",
    "DecoderBlock",
    "DinoV3Rope",
    "DistilledVisionTransformer",
    "DropPath",
    "EncoderBlock",
    "KVCache",
    "LayerScale",
    "Mlp",
    "MultiHeadAttention",
    "PatchEmbed",
    "QuickGELU",
    "ShiftedPatchEmbed",
    "SimpleFeaturePyramid",
    "TextConfig",
    "ViTConfig",
    "VisionTransformer",
    "build_model",
    "create_model",
    "list_models",
]
