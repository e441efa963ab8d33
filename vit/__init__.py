"""vit: a readable Vision Transformer for PyTorch and Lightning that loads real checkpoints."""

from vit.checkpoints.weights import load_pretrained
from vit.nn.attention import MultiHeadAttention
from vit.nn.configs import ViTConfig
from vit.nn.vision import VisionTransformer, create_model, list_models

__version__ = "0.1.0"

__all__ = ["MultiHeadAttention", "ViTConfig", "VisionTransformer", "create_model", "list_models", "load_pretrained"]
