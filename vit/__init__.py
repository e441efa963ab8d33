"""vit: a readable Vision Transformer for PyTorch and Lightning that loads real checkpoints."""

from vit import _graveyard
from vit.checkpoints.weights import load_pretrained
from vit.nn.attention import MultiHeadAttention
from vit.nn.configs import ViTConfig
from vit.nn.vision import VisionTransformer, create_model, list_models

__version__ = "0.2.0"  # the one place: pyproject.toml reads it (dynamic), `vit --version` too

__all__ = ["MultiHeadAttention", "ViTConfig", "VisionTransformer", "create_model", "list_models", "load_pretrained"]

_graveyard.install()  # 0.1's import paths (vit.checkpoint, vit.weights, ...) until 0.3.0
