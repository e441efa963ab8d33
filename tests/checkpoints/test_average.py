"""Weight averages of classifier checkpoints: WiSE-FT's mix of two, a uniform soup of several, and the refusals.

The expected weights are the formula applied by hand to the tensors the tests wrote, never read back through the
code under test."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import DIGITS_VIT, TINY, TINY_DIM
from vit.checkpoints.average import MismatchedCheckpointsError, average_checkpoints, mixing_weights
from vit.checkpoints.io import save_checkpoint
from vit.checkpoints.meta import classifier_checkpoint
from vit.errors import UserValueError
from vit.tasks import ImageClassifier


def write(path, seed=0, ema=False, **kwargs):
    """A classifier checkpoint of the tiny digits ViT from ``seed``, as `vit fit` writes its weights; returns the
    evaluated weights it holds. ``ema``: the EMA copy is other weights (seed + 100), which evaluation uses."""
    torch.manual_seed(seed)
    model_kwargs = {**TINY, **kwargs.pop("model_kwargs", {})}
    task = ImageClassifier(**{"model": DIGITS_VIT, **kwargs}, model_kwargs=model_kwargs)
    weights = {k: v.clone() for k, v in task.model.state_dict().items()}
    checkpoint = classifier_checkpoint(task.checkpoint_meta(), weights)
    if ema:
        torch.manual_seed(seed + 100)
        other = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in weights.items()}
        checkpoint["state_dict"].update({f"model_ema.module.{k}": v for k, v in other.items()})
        checkpoint["vit"]["ema"] = True
        weights = other
    save_checkpoint(checkpoint, path)
    return weights


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 1.0])
def test_wise_ft_mixes_two_checkpoints_as_one_minus_alpha_a_plus_alpha_b(tmp_path, alpha):
    a, b = write(tmp_path / "a.ckpt", seed=0), write(tmp_path / "b.ckpt", seed=1)
    out = average_checkpoints([tmp_path / "a.ckpt", tmp_path / "b.ckpt"], alpha)
    assert out["vit"]["task"] == "classify" and out["vit"]["ema"] is False
    for k in a:
        torch.testing.assert_close(out["state_dict"][f"model.{k}"], (1 - alpha) * a[k] + alpha * b[k])
    assert [s["weight"] for s in out["averaged_from"]] == pytest.approx([1 - alpha, alpha])


def test_a_soup_of_three_is_their_mean(tmp_path):
    ws = [write(tmp_path / f"{i}.ckpt", seed=i) for i in range(3)]
    out = average_checkpoints([tmp_path / f"{i}.ckpt" for i in range(3)])
    for k in ws[0]:
        torch.testing.assert_close(out["state_dict"][f"model.{k}"], (ws[0][k] + ws[1][k] + ws[2][k]) / 3)


@pytest.mark.parametrize("ema", [False, True])
def test_each_checkpoint_gives_the_weights_it_is_evaluated_with(tmp_path, ema):
    a = write(tmp_path / "a.ckpt", seed=0, ema=ema)  # its EMA copy when it has one, else its model
    b = write(tmp_path / "b.ckpt", seed=1)
    out = average_checkpoints([tmp_path / "a.ckpt", tmp_path / "b.ckpt"], 0.5)
    k = "head.weight"
    torch.testing.assert_close(out["state_dict"][f"model.{k}"], 0.5 * a[k] + 0.5 * b[k])
    assert not any(key.startswith("model_ema.") for key in out["state_dict"])


def test_dropout_rates_are_no_other_architecture(tmp_path):
    write(tmp_path / "a.ckpt", seed=0)
    write(tmp_path / "b.ckpt", seed=1, model_kwargs={"drop_path_rate": 0.1})
    average_checkpoints([tmp_path / "a.ckpt", tmp_path / "b.ckpt"], 0.5)


@pytest.mark.parametrize(("other", "said"), [
    ({"model_kwargs": {"depth": 3}}, "different architectures (depth 2 and 3)"),
    ({"model_kwargs": {"embed_dim": 48}}, f"different architectures (embed_dim {TINY_DIM} and 48)"),
    ({"class_names": [str(9 - i) for i in range(10)]}, "the same classes in another order"),
    ({"num_classes": 3, "class_names": ["0", "1", "cat"]}, "different class lists (10 and 3 classes; only in the "
                                                           "first: 2, 3, 4; only in the second: cat)"),
    ({"mean": [0.4], "std": [0.5]}, "different input normalisation"),
    ({"std": [0.25]}, "different input normalisation (mean/std [0.5]/[0.5] and [0.5]/[0.25])"),  # std alone
])
def test_other_architectures_or_class_lists_are_refused_in_one_line(tmp_path, other, said):
    write(tmp_path / "a.ckpt", seed=0, class_names=[str(i) for i in range(10)])
    write(tmp_path / "b.ckpt", seed=1, **other)
    with pytest.raises(MismatchedCheckpointsError) as caught:
        average_checkpoints([tmp_path / "a.ckpt", tmp_path / "b.ckpt"], 0.5)
    message = str(caught.value)
    assert "\n" not in message and said in message
    assert f"cannot average {tmp_path / 'a.ckpt'} and {tmp_path / 'b.ckpt'}" in message


def test_another_model_is_named(tmp_path):
    write(tmp_path / "a.ckpt", seed=0)
    write(tmp_path / "b.ckpt", seed=1, model="vit_tiny_patch16_224", img_size=8, in_chans=1,
          model_kwargs={"patch_size": 2})
    with pytest.raises(MismatchedCheckpointsError, match="different models \\(vit_digits_patch2_8 and "
                                                         "vit_tiny_patch16_224\\)"):
        average_checkpoints([tmp_path / "a.ckpt", tmp_path / "b.ckpt"])


def test_the_third_checkpoint_of_a_soup_is_checked_too(tmp_path):
    write(tmp_path / "a.ckpt", seed=0)
    write(tmp_path / "b.ckpt", seed=1)
    write(tmp_path / "c.ckpt", seed=2, model_kwargs={"depth": 1})
    with pytest.raises(MismatchedCheckpointsError, match=r"c\.ckpt: different architectures"):
        average_checkpoints([tmp_path / f"{n}.ckpt" for n in "abc"])


def test_a_checkpoint_of_another_task_is_refused(tmp_path):
    write(tmp_path / "a.ckpt", seed=0)
    save_checkpoint({"vit": {"task": "pretrain"}, "state_dict": {}}, tmp_path / "mae.ckpt")
    with pytest.raises(UserValueError, match="MaskedAutoencoder"):
        average_checkpoints([tmp_path / "a.ckpt", tmp_path / "mae.ckpt"])


@pytest.mark.parametrize(("count", "alpha", "expected"), [
    (2, None, [0.5, 0.5]), (4, None, [0.25] * 4), (2, 0.0, [1.0, 0.0]), (2, 1.0, [0.0, 1.0]), (2, 0.25, [0.75, 0.25]),
])
def test_mixing_weights(count, alpha, expected):
    assert mixing_weights(count, alpha) == pytest.approx(expected)


@pytest.mark.parametrize(("count", "alpha", "said"), [
    (1, None, "at least two checkpoints"), (3, 0.5, "leave --alpha out"),
    (2, -0.01, "must lie in \\[0, 1\\]"), (2, 1.01, "must lie in \\[0, 1\\]"),
])
def test_mixing_weights_refuses(count, alpha, said):
    with pytest.raises(UserValueError, match=said):
        mixing_weights(count, alpha)
