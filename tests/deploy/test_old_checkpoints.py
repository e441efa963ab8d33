"""`load_classifier` (and `load_task`) of checkpoints that vit 0.1 wrote, whose hyperparameters had another shape
(flat ``lr``, ``label_smoothing``, ``ema_decay``; `ConvNetClassifier`): the same network, weights and preparation.

The files in data/ were written by the code of commit 4b78d2f: ``vit_0.1_digits.ckpt`` by `vit fit` on the digits
recipe (a one-block ViT, EMA on, two steps), ``convnet_0.1.ckpt`` by a Trainer around 0.1's ``ConvNetClassifier``
(resnet10t, 3 classes, EMA on). The expected logits are what 0.1's ``load_classifier`` answered for the same input.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vit.checkpoints.io import read_checkpoint
from vit.deploy import load_classifier
from vit.errors import UserValueError
from vit.tasks import DistilledClassifier, ImageClassifier, load_task

DATA = Path(__file__).parent / "data"
OLD = {  # file: (class names, 0.1's logits of the first image, their sum over both images)
    "vit_0.1_digits.ckpt": ([str(i) for i in range(10)], [0.0127, -0.1902, 0.1414, 0.0092, -0.0891, 0.0669, 0.0523,
                                                          0.1905, -0.15, 0.1109], 0.30321887),
    "convnet_0.1.ckpt": (["a", "b", "c"], [-0.1884, -0.0568, 0.1526], -0.09309804),
}


def first_images(classifier) -> torch.Tensor:
    return torch.randn(2, classifier.in_chans, *classifier.img_size, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", sorted(OLD))
def test_a_checkpoint_written_by_0_1_loads_as_it_did(name):
    names, logits, total = OLD[name]
    assert "lr" in read_checkpoint(DATA / name)["hyper_parameters"]  # the old, flat shape
    classifier = load_classifier(DATA / name)
    assert classifier.class_names == names and classifier.img_size == (16, 16) and classifier.in_chans == 1
    with torch.no_grad():
        out = classifier(first_images(classifier))
    assert out[0].tolist() == pytest.approx(logits, abs=1e-4) and out.sum().item() == pytest.approx(total, abs=1e-5)


@pytest.mark.parametrize("name", sorted(OLD))
def test_load_task_reads_a_0_1_checkpoint_into_the_new_arguments(name):
    task = load_task(DATA / name, ImageClassifier)
    classifier = load_classifier(DATA / name)
    assert task.optim.ema_decay is not None and task.model_ema is not None  # ema_decay came back, as optim's
    assert task.head.label_smoothing == 0.1 and task.backbone.kind == ("timm" if "convnet" in name else "vit")
    x = first_images(classifier)
    with torch.no_grad():
        torch.testing.assert_close(task(x), classifier(x))


def test_a_distilling_0_1_checkpoint_names_the_task_that_reads_it(tmp_path):
    checkpoint = read_checkpoint(DATA / "vit_0.1_digits.ckpt")
    checkpoint["hyper_parameters"]["distillation"] = "hard"
    torch.save(checkpoint, tmp_path / "distilled.ckpt")
    with pytest.raises(UserValueError, match=r"load_task\(path, vit\.tasks\.DistilledClassifier\)"):
        load_task(tmp_path / "distilled.ckpt", ImageClassifier)
    assert issubclass(DistilledClassifier, ImageClassifier)
