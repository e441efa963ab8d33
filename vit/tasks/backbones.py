"""The networks a classification task can train, as siblings: our ViTs (every family of ``vit.list_models()``) and
timm's models (a convnet teacher, configs/teacher_small.yaml). The task picks one by ``backbone``:

    backbone: vit      model: a name of vit.list_models()     the default
    backbone: timm     model: a name of timm.list_models()    e.g. resnet10t
    backbone: my_package.MyBackbone                            a `Backbone` subclass of your own

A backbone builds the network for the run's classes and input, loads pretrained weights into it, says which of its
parameters play which role (`vit.nn.roles`: layer decay and the fine-tuning modes follow), and writes and checks
what a checkpoint records about it, so that `vit.deploy.load_classifier` rebuilds it without the config.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from vit.errors import UserValueError
from vit.nn.roles import ParamRoles, roles_of
from vit.nn.vision import MODEL_CONFIGS, VisionTransformer, ViTConfig, create_model


class Backbone:
    """How a task builds, loads and describes its network (see the module docstring)."""

    kind: ClassVar[str] = ""  # the short name a config gives, e.g. "vit"

    def build(self, name: str, num_classes: int, img_size: int | None, in_chans: int | None,
              options: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
        """(the network, randomly initialised; the config a checkpoint rebuilds it from)."""
        raise NotImplementedError

    def load_pretrained(self, network: nn.Module, source: str) -> None:
        """Load the weights ``source`` names (a file, or a tag) into ``network``; a new head is fine."""
        raise NotImplementedError

    def roles(self, network: nn.Module) -> ParamRoles:
        """Which of ``network``'s parameters play which role."""
        return roles_of(network)

    def meta(self, img_size: int | None) -> dict[str, Any]:
        """What the checkpoint records besides the model's name and config."""
        return {}

    def check_checkpoint(self, meta: dict[str, Any], name: str, config: dict[str, Any]) -> None:
        """A clear error when a checkpoint's network (``meta``) is not this run's (``name``, ``config``)."""
        if (meta.get("model_name"), meta.get("model_config")) != (name, config):
            raise UserValueError(f"the checkpoint holds {meta.get('model_name')} {meta.get('model_config')}, this run "
                                 f"builds {name} {config}")


class ViTBackbone(Backbone):
    """Our `VisionTransformer` by name, with `ViTConfig` overrides as ``model_kwargs``."""

    kind = "vit"

    def build(self, name: str, num_classes: int, img_size: int | None, in_chans: int | None,
              options: dict[str, Any]) -> tuple[VisionTransformer, dict[str, Any]]:
        """The named ViT with this run's sizes (``num_classes`` 0: an encoder, no head) and ``options``."""
        if name not in MODEL_CONFIGS:
            raise UserValueError(f"unknown model {name!r}; known models: {', '.join(sorted(MODEL_CONFIGS))}")
        overrides = dict(options, num_classes=num_classes)
        if img_size is not None:
            overrides["img_size"] = img_size
        if in_chans is not None:
            overrides["in_chans"] = in_chans
        network = create_model(name, **overrides)
        return network, network.config.to_dict()

    def load_pretrained(self, network: nn.Module, source: str) -> None:
        """`vit.load_pretrained`: our checkpoints, timm's and others' files, hub tags; every key checked."""
        from vit.checkpoints.weights import load_pretrained

        load_pretrained(network, source)

    def check_checkpoint(self, meta: dict[str, Any], name: str, config: dict[str, Any]) -> None:
        """Compares the two configs with their defaults filled in, and names every field that differs."""
        theirs, ours = ViTConfig.from_dict(meta["model_config"]).to_dict(), ViTConfig.from_dict(config).to_dict()
        differ = [f"{k}: checkpoint {theirs.get(k)!r}, this model {ours.get(k)!r}"
                  for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k)]
        if meta["model_name"] != name or differ:
            raise UserValueError(
                f"the checkpoint was written for {describe(meta['model_name'], theirs)}, this run builds "
                f"{describe(name, ours)}; they differ in {'; '.join(differ) or 'the model name'}"
            )


class TimmBackbone(Backbone):
    """A timm model by name (``timm.create_model``, its keyword arguments as ``model_kwargs``), e.g. a convnet that
    teaches a ViT student. Its roles come from timm's ``group_matcher``: stem, stages as blocks, the classifier as
    head, so layer decay and every fine-tuning mode apply."""

    kind = "timm"

    def build(self, name: str, num_classes: int, img_size: int | None, in_chans: int | None,
              options: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
        """The timm model with random weights; its config is ``timm.create_model``'s arguments."""
        import timm

        if not timm.is_model(name):
            raise UserValueError(f"unknown timm model {name!r} (timm.list_models() lists them)")
        if img_size is None:  # a ViT's config holds its input side; a timm network's checkpoint records this one
            raise UserValueError(f"backbone: timm needs img_size, the input side {name} trains at (vit fit links it "
                                 "from the data)")
        config = {**options, "num_classes": num_classes, "in_chans": in_chans or 3}
        network = timm.create_model(name, **config)
        network.in_chans = config["in_chans"]  # what the classifier's preprocessing reads
        return network, config

    def load_pretrained(self, network: nn.Module, source: str) -> None:
        """A weights file for this network, or a timm tag (``resnet10t.c3_in1k``), through timm's own loading: a
        classifier of another size is left out, and another channel count adapts the first convolution."""
        from timm.models import get_pretrained_cfg, load_pretrained

        if Path(source).is_file():
            cfg: dict[str, Any] | None = {**network.pretrained_cfg, "file": source}
        else:
            found = get_pretrained_cfg(source) if "." in source else None
            cfg = found.to_dict() if found is not None else None
        if cfg is None:
            raise UserValueError(f"pretrained: {source!r} is neither a file nor a timm tag (timm.list_pretrained())")
        load_pretrained(network, pretrained_cfg=cfg, num_classes=network.num_classes, in_chans=network.in_chans)

    def roles(self, network: nn.Module) -> ParamRoles:
        """From timm's ``group_matcher(coarse=True)``: its first group the stem, the others blocks; the classifier
        (``get_classifier()``) the head; ``no_weight_decay()`` kept."""
        from timm.models import group_parameters

        classifier = network.get_classifier()
        head = tuple(n for n, m in network.named_modules() if m is classifier and n)
        groups = group_parameters(network, network.group_matcher(coarse=True)) if hasattr(network, "group_matcher") \
            else {}
        ordered = [owners(n for n in names if not any(n == h or n.startswith(h + ".") for h in head))
                   for _, names in sorted(groups.items())]
        ordered = [names for names in ordered if names]
        skip = tuple(network.no_weight_decay()) if hasattr(network, "no_weight_decay") else ()
        return ParamRoles(stem=ordered[0] if ordered else (), blocks=tuple(ordered[1:]), head=head, no_decay=skip)

    def meta(self, img_size: int | None) -> dict[str, Any]:
        """A timm network, and the input side a ViT's config would hold."""
        return {"model_source": "timm", "img_size": img_size}


def owners(names: Iterable[str]) -> tuple[str, ...]:
    """The modules that hold the parameters ``names`` (``layer1.0.bn1`` for ``layer1.0.bn1.weight``), in order: the
    entries of a role, so freezing finds the modules to put in eval mode (a BatchNorm's statistics stay)."""
    return tuple(dict.fromkeys(name.rsplit(".", 1)[0] if "." in name else name for name in names))


BACKBONES: dict[str, type[Backbone]] = {b.kind: b for b in (ViTBackbone, TimmBackbone)}


def backbone_named(kind: str) -> Backbone:
    """The backbone ``kind`` names: "vit", "timm", or the import path of a `Backbone` subclass."""
    if kind in BACKBONES:
        return BACKBONES[kind]()
    module, _, name = kind.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError):
        found = None
    if not (isinstance(found, type) and issubclass(found, Backbone)):
        raise UserValueError(f"backbone must be one of {', '.join(BACKBONES)} or the import path of a "
                             f"vit.tasks.backbones.Backbone subclass, got {kind!r}")
    return found()


def describe(name: str, config: dict[str, Any]) -> str:
    """A ViT in a sentence: its name, and its classes when it has a head."""
    return f"{name} with {config.get('num_classes')} classes" if config.get("num_classes") else name


__all__ = ["BACKBONES", "Backbone", "TimmBackbone", "ViTBackbone", "backbone_named"]
