"""The dataset Protocols name what each consumer needs: every split of the package's DataModules offers its part,
and a dataset without a piece is told apart (the consumers' isinstance checks replace attribute probes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from vit.data.base import ImageDataModule
from vit.data.cifar import TransformedSubset
from vit.data.digits import Digits
from vit.data.folder import ImageFiles
from vit.data.protocol import (
    CountsReplacements,
    EvaluationSplits,
    Fingerprinted,
    ImageFileSamples,
    ImageSplits,
    IndexedSubset,
    LabelledImages,
    ReadableImages,
)


class _Images:  # a CIFAR-like source: .data and .targets, items (PIL-able array, label)
    data = np.zeros((4, 8, 8, 3), dtype=np.uint8)
    targets = (0, 1, 0, 1)

    def __getitem__(self, i):
        return self.data[i], self.targets[i]


def test_each_split_offers_what_its_consumers_ask(tmp_path):
    files = ImageFiles([(str(tmp_path / "a.png"), 0)])
    subset = TransformedSubset(_Images(), [0, 2], transform=None)
    digits = Digits(img_size=8)
    digits.setup("fit")
    for split in (files, subset, digits.train_set):
        assert isinstance(split, LabelledImages) and isinstance(split, ReadableImages)
        assert isinstance(split, Fingerprinted)
    assert isinstance(files, ImageFileSamples) and isinstance(files, CountsReplacements)
    assert isinstance(subset, IndexedSubset) and not isinstance(subset, ImageFileSamples)
    assert isinstance(digits, ImageSplits) and isinstance(digits, EvaluationSplits)


def test_a_plain_dataset_offers_none_of_them():
    plain = TensorDataset(torch.zeros(2, 1), torch.zeros(2))
    for protocol in (LabelledImages, ReadableImages, ImageFileSamples, IndexedSubset, CountsReplacements,
                     Fingerprinted, ImageSplits, EvaluationSplits):
        assert not isinstance(plain, protocol)


def test_a_split_without_a_transform_is_refused_by_name():
    class NoTransform(Dataset):
        labels = (0,)

        def __len__(self):
            return 1

        def __getitem__(self, i):
            return torch.zeros(1), 0

    with pytest.raises(TypeError, match="NoTransform has no `transform`"):  # (Digits overrides it: the base's)
        ImageDataModule.without_augmentation(Digits(img_size=8), NoTransform())
