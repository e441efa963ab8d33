"""Neural-network modules: the attention kernel, Transformer blocks, the ViT and the text model."""

from vit.nn.attention import KVCache, MultiHeadAttention
from vit.nn.blocks import DecoderBlock, DropPath, EncoderBlock, Mlp
from vit.nn.pyramid import SimpleFeaturePyramid
from vit.nn.vision import (
    MODEL_CONFIGS,
    PatchEmbed,
    ShiftedPatchEmbed,
    VisionTransformer,
    create_model,
    list_models,
)

__all__ = [
    "MODEL_CONFIGS",
    "DecoderBlock",
    "DropPath",
    "EncoderBlock",
    "KVCache",
    "Mlp",
    "MultiHeadAttention",
    "PatchEmbed",
    "ShiftedPatchEmbed",
    "SimpleFeaturePyramid",
    "VisionTransformer",
    "create_model",
    "list_models",
]
