"""Heads (`vit.tasks.heads`): what a classifier's logits mean. The single-label head's losses, mixing, metrics,
class weights and answer; a head of another kind plugs into the classifier without a new option."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn
from torchmetrics import MeanMetric, MetricCollection

from tests.helpers import tiny_classifier
from vit.errors import UserValueError
from vit.tasks.heads import ClassificationHead, SingleLabelHead


def test_the_single_label_head_builds_its_losses_metrics_and_answer():
    head = SingleLabelHead(label_smoothing=0.2)
    assert head.train_loss(10).label_smoothing == 0.2 and head.eval_loss(10).label_smoothing == 0.0
    assert head.mixer(10) is None
    train, val = head.metrics(10)
    assert list(train) == ["acc"] and list(val) == ["acc", "acc_balanced", "acc_top5"]
    assert list(head.metrics(3)[1]) == ["acc", "acc_balanced"]  # no top-5 of 3 classes
    logits = torch.randn(4, 10)
    torch.testing.assert_close(head.predict(logits), logits.softmax(-1))
    mixing = SingleLabelHead(mixup_alpha=0.8)
    x, y = mixing.mixer(10)(torch.randn(5, 1, 8, 8), torch.arange(5))
    assert x.shape == (4, 1, 8, 8) and y.shape == (4, 10)  # an odd batch loses one image; targets are soft
    with pytest.raises(UserValueError, match=r"label_smoothing must be in \[0, 1\)"):
        SingleLabelHead(label_smoothing=1.0)


def test_class_weights_weigh_each_class_alike_and_refuse_an_empty_one():
    assert SingleLabelHead().class_weights(torch.tensor([1.0, 3.0]), ["a", "b"]) is None  # off by default
    weights = SingleLabelHead(class_weighting=True).class_weights(torch.tensor([1.0, 3.0]), ["a", "b"])
    torch.testing.assert_close(weights, torch.tensor([2.0, 2 / 3]))  # total / (classes x count)
    with pytest.raises(UserValueError, match=r"classes without training images: \['b'\]"):
        SingleLabelHead(class_weighting=True).class_weights(torch.tensor([2.0, 0.0]), ["a", "b"])


@dataclass(frozen=True)
class MeanSquaredHead(ClassificationHead):
    """A head of another kind: logits regressed on one-hot labels, answered as they are."""

    def train_loss(self, num_classes, class_weights=None):
        return OneHotMSE(num_classes)

    def eval_loss(self, num_classes):
        return OneHotMSE(num_classes)

    def metrics(self, num_classes):
        return MetricCollection({"mean": MeanMetric()}), MetricCollection({"mean": MeanMetric()})

    def predict(self, logits):
        return logits


class OneHotMSE(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes

    def forward(self, logits, labels):
        return (logits - nn.functional.one_hot(labels, self.num_classes).float()).pow(2).mean()


def test_a_head_of_another_kind_plugs_in_without_a_new_option():
    model = tiny_classifier(head=MeanSquaredHead())
    assert isinstance(model.train_loss, OneHotMSE) and model.mixup is None
    assert model.hparams.head == {"class_path": f"{__name__}.MeanSquaredHead", "init_args": {}}  # plain data
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(model.predict_step(x, 0), model(x))  # its answer: the logits


def test_single_label_head_logit_norm_switches_the_training_loss_and_rejects_negative_tau():
    import torch.nn.functional as F

    logits, labels = torch.randn(5, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 0, 1])
    plain = SingleLabelHead(label_smoothing=0.0).train_loss(3)
    normed = SingleLabelHead(label_smoothing=0.0, logit_norm=0.5).train_loss(3)
    assert torch.allclose(plain(logits, labels), F.cross_entropy(logits, labels))
    expected = F.cross_entropy(logits / (0.5 * logits.norm(dim=1, keepdim=True)), labels)
    assert torch.allclose(normed(logits, labels), expected, atol=1e-6)
    with pytest.raises(UserValueError, match="logit_norm"):
        SingleLabelHead(logit_norm=-0.1).train_loss(3)
