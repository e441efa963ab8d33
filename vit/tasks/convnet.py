"""0.1's convnet classifier, kept for one release: a timm network is now a backbone of `ImageClassifier`, a sibling
of our ViTs (`vit.tasks.backbones`). In a config::

    model:
      class_path: vit.tasks.ImageClassifier
      init_args: {backbone: timm, model: resnet10t, model_kwargs: {...}}
"""

from __future__ import annotations

import warnings
from typing import Any

from vit.tasks.classify import ImageClassifier


class ConvNetClassifier(ImageClassifier):
    """Deprecated: `ImageClassifier` with ``backbone: timm`` (which this is, with 0.1's defaults)."""

    def __init__(self, model: str = "resnet10t", img_size: int = 32, backbone: str = "timm", **kwargs: Any) -> None:
        warnings.warn("vit.tasks.ConvNetClassifier is deprecated: use vit.tasks.ImageClassifier with backbone: timm "
                      "(configs/teacher_small.yaml)", DeprecationWarning, stacklevel=2)
        super().__init__(model=model, img_size=img_size, backbone=backbone, **kwargs)


__all__ = ["ConvNetClassifier"]
