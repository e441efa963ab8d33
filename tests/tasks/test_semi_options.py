"""FixMatch's options beyond the paper's (configs/semi_small.yaml sets them): the EMA as the teacher that labels the
weak view, the pool's two views given by the recipe, and the pool's views keeping ``data.hflip: 0``."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F

from vit.data.pool import STRONG, WEAK, view_settings
from vit.data.transforms import Augmentation
from vit.errors import UserValueError
from vit.tasks import Optimization
from vit.tasks.semi import FixMatch

MILD = Augmentation(auto_augment=None, re_prob=0.0, hflip=0.5, color_jitter=0.0, scale=(0.8, 1.0))


@pytest.mark.parametrize("view", ["weak", "strong", MILD])
def test_the_pool_views_flip_only_where_the_labelled_images_may(view):
    own = {"weak": WEAK, "strong": STRONG}.get(view, view)
    flipping, not_flipping = Augmentation(hflip=0.5), Augmentation(hflip=0.0)
    assert view_settings(view, flipping) == own and own.hflip == 0.5
    assert view_settings(view, not_flipping) == dataclasses.replace(own, hflip=0.0)  # only the flip changes


def test_the_views_given_to_the_task_are_the_ones_the_pool_reads():
    assert FixMatch(model="vit_digits_patch2_8").unlabelled_views == ("weak", "strong")
    assert FixMatch(model="vit_digits_patch2_8", strong_view=MILD).unlabelled_views == ("weak", MILD)


def test_an_unknown_teacher_is_refused():
    with pytest.raises(UserValueError, match="teacher must be 'model' or 'ema'"):
        FixMatch(model="vit_digits_patch2_8", teacher="student")


@pytest.mark.parametrize("teacher", ["model", "ema"])
def test_the_chosen_weights_label_the_weak_view(teacher):
    """The trained weights answer class 0 for every image, their EMA class 2: the pool's loss is the cross-entropy
    of the trained weights' strong-view logits against the teacher's class (every confidence passes τ)."""
    torch.manual_seed(0)
    task = FixMatch(model="vit_digits_patch2_8", num_classes=3, img_size=8, in_chans=1, threshold=0.9,
                    teacher=teacher, optim=Optimization(ema_decay=0.9))
    for model, answer in ((task.model, 0), (task.model_ema.module, 2)):
        with torch.no_grad():
            model.head.weight.zero_()
            model.head.bias.copy_(F.one_hot(torch.tensor(answer), 3) * 20.0)
    task.eval()  # no drop path: the expected loss below sees the same logits
    x, weak, strong = torch.randn(4, 1, 8, 8), torch.randn(6, 1, 8, 8), torch.randn(6, 1, 8, 8)
    y = torch.tensor([0, 1, 2, 0])
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # self.log without a trainer
        loss = task.training_step({"labelled": [x, y], "unlabelled": [weak, strong]}, 0)
        label = torch.full((6,), 0 if teacher == "model" else 2)
        expected = task.train_loss(task.model(x), y) + F.cross_entropy(task.model(strong), label)
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)


def test_a_val_set_all_right_keeps_the_last_temperature_and_one_mistake_refits_it():
    task = FixMatch(model="vit_digits_patch2_8", num_classes=3)
    task.temperature.fill_(0.4)
    logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 2.0, 0.5], [0.2, 0.0, 1.0], [1.0, 0.8, 0.0]])
    task.update_temperature(logits, torch.tensor([0, 1, 2, 0]))  # every argmax right: T unidentifiable
    assert float(task.temperature) == pytest.approx(0.4)
    labels = torch.tensor([0, 1, 2, 1])  # one mistake: T is the NLL's minimiser, found here by a grid
    grid = torch.linspace(0.05, 5.0, 4951, dtype=torch.float64)
    nll = torch.stack([F.cross_entropy(logits.double() / t, labels) for t in grid])
    task.update_temperature(logits, labels)
    assert float(task.temperature) == pytest.approx(float(grid[nll.argmin()]), abs=2e-3)
