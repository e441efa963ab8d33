"""Class balance (`vit.data.balance`): the count report and its error, the imbalance warning on both sides of its
10% bar with advice for each label kind, and the sampler's weights against the hand formula 1 / (class count)."""

from __future__ import annotations

import warnings

import pytest
import torch

from vit.data.balance import CLASS_WEIGHTING, MULTI_LABEL_HEAD, balanced_sampler, imbalance_advice, report_class_counts
from vit.errors import UserValueError


def warned(counts: list[int], multi_label: bool = False, balanced: bool = False) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report_class_counts("data", ["a", "b", "c"], counts, multi_label, balanced=balanced)
    return [str(w.message) for w in caught if "imbalanced" in str(w.message)]


def test_the_warning_fires_under_a_tenth_of_the_largest_class_and_not_at_it():
    (message,) = warned([100, 9, 50])
    assert "'b' has 9 training images, under 10% of the largest class's 100" in message
    assert message.endswith(imbalance_advice(False))
    assert warned([100, 10, 50]) == []  # exactly a tenth: balanced enough


def test_no_advice_to_turn_on_the_balanced_sampling_that_is_on(caplog):
    # a user who followed the advice is told the classes are drawn evenly, not given the same advice again
    with caplog.at_level("INFO"):
        assert warned([100, 9, 50], balanced=True) == []
    assert "'b' has 9 training images" in caplog.text and "drawn evenly (balanced_sampling)" in caplog.text


@pytest.mark.parametrize("multi_label", [False, True])
def test_the_advice_suits_the_label_kind(multi_label):
    advice = imbalance_advice(multi_label)
    assert CLASS_WEIGHTING in advice
    # a multi-label image has no one class to draw it by: no balanced sampling, and the head named with its weighting
    assert ("balanced_sampling" in advice) is not multi_label and (MULTI_LABEL_HEAD in advice) is multi_label
    (message,) = warned([100, 1, 50], multi_label)
    assert message.endswith(advice)


def test_a_class_without_training_images_is_an_error_naming_it():
    with pytest.raises(UserValueError, match=r"data: no training image of class 'b': add images"):
        report_class_counts("data", ["a", "b", "c"], [3, 0, 4], False)


def test_the_sampler_weighs_each_image_by_one_over_its_class_count():
    labels = [0, 0, 0, 1, 2, 2]
    sampler = balanced_sampler([3, 1, 2], labels)
    expected = torch.tensor([1 / 3, 1 / 3, 1 / 3, 1.0, 1 / 2, 1 / 2], dtype=torch.float64)
    assert torch.allclose(sampler.weights, expected) and sampler.num_samples == 6 and sampler.replacement
