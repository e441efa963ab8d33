"""A timm convnet trained like the ViT classifier, whose only role is to teach (configs/teacher_small.yaml).

DeiT's students learn a convnet's inductive bias from a convnet teacher. On a small folder that teacher is trained
from scratch first, through the same `vit fit`, DataModule, augmentation, loss, optimiser, schedule, EMA and
metrics as the ViT; `ConvNetClassifier` changes only the network (any ``timm.create_model`` name, with its
keyword arguments) and what follows from it: no layer decay, no partial freezing, no attention maps. Its
checkpoint is a "classify" checkpoint that `vit.deploy.load_classifier`, and so a student's ``teacher:``,
rebuilds alone.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from vit.errors import UserValueError
from vit.tasks.base import BaseTask
from vit.tasks.classify import ImageClassifier


class ConvNetClassifier(ImageClassifier):
    """`ImageClassifier` around a timm model (e.g. ``resnet10t``) instead of a ViT.

    Args:
        model: a name from ``timm.list_models()``; built with random weights.
        model_kwargs: more ``timm.create_model`` arguments (e.g. ``{channels: [32, 64, 128, 256]}``).
        img_size: the input side (linked from the datamodule), recorded in the checkpoint.
        **kwargs: the `ImageClassifier` options, except layer decay, fine-tuning strategies and distillation.
    """

    def __init__(self, model: str = "resnet10t", img_size: int = 32, **kwargs: Any) -> None:
        for name, allowed in (("layer_decay", None), ("finetune", "full"), ("distillation", "none"),
                              ("pretrained", None)):
            if kwargs.get(name, allowed) != allowed:
                raise UserValueError(f"ConvNetClassifier trains a timm convnet from scratch: {name} must be "
                                     f"{allowed!r}, got {kwargs[name]!r} (distil a ViT student from it instead)")
        super().__init__(model=model, img_size=img_size, **kwargs)

    def create_vit(self, num_classes: int, **extra: Any) -> nn.Module:  # type: ignore[override]
        """The network `ImageClassifier.configure_models` builds (and copies for EMA): here the timm model. Sets
        ``model_name`` and ``model_config``: the checkpoint rebuilds it as timm.create_model(name, **config)."""
        import timm

        hp = self.hparams
        if not timm.is_model(hp.model):
            raise UserValueError(f"unknown timm model {hp.model!r} (timm.list_models() lists them)")
        self.model_config: dict[str, Any] = {**(hp.model_kwargs or {}), "num_classes": num_classes,
                                             "in_chans": hp.in_chans or 3}
        self.model_name: str = hp.model
        model = timm.create_model(hp.model, **self.model_config)
        model.in_chans = self.model_config["in_chans"]  # what the classifier's preprocessing reads
        return model

    def frozen_modules(self, epoch: int) -> list[nn.Module]:
        return []  # finetune: full, always

    def checkpoint_meta(self) -> dict[str, Any]:
        """The classifier's record, marked as a timm network, with the input size a ViT's config would hold."""
        return {**super().checkpoint_meta(), "model_source": "timm", "img_size": self.hparams.img_size}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Before any weight is copied: a checkpoint of another task or network is a clear error."""
        meta = checkpoint.get("vit") or {}
        if meta.get("task") == "classify" and (meta.get("model_name"), meta.get("model_config")) != (
                self.model_name, self.model_config):
            raise UserValueError(f"the checkpoint holds {meta.get('model_name')} {meta.get('model_config')}, this run "
                                 f"builds {self.model_name} {self.model_config}")
        BaseTask.on_load_checkpoint(self, checkpoint)  # the task check (VisionTask's compares ViT configs)


__all__ = ["ConvNetClassifier"]
