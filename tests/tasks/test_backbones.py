"""Backbones (`vit.tasks.backbones`): our ViT and a timm network as siblings of one classifier. A timm network's
roles come from timm's group_matcher, so layer decay and the fine-tuning modes apply to it as to a ViT; it loads
pretrained weights through timm; a backbone of one's own is named by its import path."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import TINY_DIM, quick_trainer
from vit.errors import UserValueError
from vit.tasks import ImageClassifier, Optimization
from vit.tasks.backbones import TimmBackbone, ViTBackbone, backbone_named
from vit.tasks.finetune import LinearProbe
from vit.tasks.optim import param_groups

SHRUNK = {"channels": [8, 16, 32, 64], "stem_width": 8}


def convnet(**kwargs) -> ImageClassifier:
    torch.manual_seed(0)
    return ImageClassifier(backbone="timm", model="resnet10t", model_kwargs=SHRUNK, in_chans=1, img_size=8,
                           num_classes=3, **kwargs)


def fit(model: ImageClassifier, tmp_path) -> None:
    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(16, 1, 8, 8, generator=g), torch.arange(16) % 3), batch_size=8)
    quick_trainer(tmp_path, max_steps=2).fit(model, data)


def test_a_timm_network_has_a_stem_blocks_and_a_head_so_layer_decay_applies():
    model = convnet(optim=Optimization(lr=1.0, layer_decay=0.5))
    roles = model.roles
    assert roles.head == ("fc",) and roles.depth == 4  # resnet's four stages, coarse
    assert roles.role("conv1.0.weight") == "stem" and roles.block("layer3.0.conv1.weight") == 2
    groups = param_groups(model.model, 1.0, 0.05, 0.5, roles=roles)
    lrs = {g["name"]: g["lr"] for g in groups}
    assert lrs["layer0_decay"] == pytest.approx(0.5**5) and lrs["layer4_decay"] == pytest.approx(0.5)
    assert lrs["head_decay"] == 1.0 and lrs["head_no_decay"] == 1.0
    assert all(p.ndim <= 1 for g in groups if g["name"].endswith("no_decay") for p in g["params"])


def test_a_linear_probe_of_a_timm_network_trains_its_classifier_alone(tmp_path):
    model = convnet(finetune=LinearProbe(), optim=Optimization(lr=0.01))
    before = {k: v.clone() for k, v in model.model.state_dict().items() if v.is_floating_point()}
    fit(model, tmp_path)
    after = model.model.state_dict()
    assert {k for k in before if not torch.equal(before[k], after[k])} == {"fc.weight", "fc.bias"}


def test_a_timm_network_loads_pretrained_weights_through_timm(tmp_path):
    import timm
    from safetensors.torch import save_file

    source = timm.create_model("resnet10t", num_classes=10, **SHRUNK)  # 3 channels, 10 classes
    save_file(source.state_dict(), str(tmp_path / "resnet.safetensors"))
    model = convnet(pretrained=str(tmp_path / "resnet.safetensors"))
    model.configure_model()
    ours, theirs = model.model.state_dict(), source.state_dict()
    torch.testing.assert_close(ours["layer4.0.conv2.weight"], theirs["layer4.0.conv2.weight"])
    torch.testing.assert_close(ours["conv1.0.weight"], theirs["conv1.0.weight"].sum(1, keepdim=True))  # 1 channel
    assert ours["fc.weight"].shape == (3, 64)  # a new head for this run's classes


class Tiny(ViTBackbone):
    """A backbone of one's own: our ViT, always one block deep."""

    def build(self, name, num_classes, img_size, in_chans, options):
        return super().build(name, num_classes, img_size, in_chans, {**options, "depth": 1})


def test_a_backbone_is_named_by_kind_or_import_path():
    assert isinstance(backbone_named("vit"), ViTBackbone) and isinstance(backbone_named("timm"), TimmBackbone)
    model = ImageClassifier(backbone=f"{__name__}.Tiny", model_kwargs={"embed_dim": TINY_DIM, "num_heads": 2})
    assert len(model.model.blocks) == 1 and model.roles.depth == 1
    for bad in ("tf", "torch.nn.Linear", "no.such.Module"):
        with pytest.raises(UserValueError, match="backbone must be one of vit, timm or the import path"):
            backbone_named(bad)
    with pytest.raises(UserValueError, match="unknown timm model 'resnet_nope'"):
        ImageClassifier(backbone="timm", model="resnet_nope", img_size=8)
    with pytest.raises(UserValueError, match="backbone: timm needs img_size"):
        ImageClassifier(backbone="timm", model="resnet10t")
