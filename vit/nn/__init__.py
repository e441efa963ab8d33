"""Neural-network modules: the attention kernel, Transformer blocks, the ViT and the text model.

    attention.py  multi-head scaled dot-product attention: the one kernel every Transformer here uses
    rope.py       rotary position embeddings, as DINOv3 uses them
    blocks.py     the Transformer blocks the ViT and the text model share
    layers.py     patch embeddings and SigLIP's attention pool
    configs.py    one frozen config per model, and the named ViTs
    vision.py     the Vision Transformer, with timm's state-dict names, for every family
    roles.py      which parameters play which role (stem, tokens, blocks, pool, head; no weight decay)
    lora.py       LoRA and DoRA adapters on the ViT's linear layers, merged exactly into plain weights
    mae.py        the masked autoencoder's encoder and decoder
    pyramid.py    a ViT as a multi-scale backbone (ViTDet's simple feature pyramid)
    clip.py       CLIP and SigLIP: an image tower and a text tower on the same blocks
    text.py       the text encoder-decoder Transformer"""

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
