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
from vit.data.files import ImageFiles
from vit.data.protocol import (
    CountsReplacements,
    EvaluationSplits,
    Fingerprinted,
    FractionSplit,
    ImageFileSamples,
    ImageSplits,
    IndexedSubset,
    LabelledImages,
    ReadableImages,
    SplitFolders,
    TableRows,
    ValSize,
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


def test_each_datamodule_offers_what_its_consumers_ask(tmp_path):
    from vit.commands.probe import test_split_hint
    from vit.data.cifar import CIFAR
    from vit.data.folder import ImageFolder
    from vit.data.table import LabelsFile

    for name in ("a", "b"):
        (tmp_path / "train" / name).mkdir(parents=True)  # the split layout (read when split_folders is asked)
    folder, table, cifar, digits = ImageFolder(tmp_path), LabelsFile(tmp_path), CIFAR(tmp_path), Digits(img_size=8)
    assert isinstance(table, TableRows) and not isinstance(folder, TableRows)  # `vit audit`'s bad rows
    assert isinstance(folder, SplitFolders) and isinstance(folder, FractionSplit)
    assert isinstance(cifar, ValSize) and not isinstance(cifar, (FractionSplit, SplitFolders))
    assert isinstance(digits, FractionSplit) and not isinstance(digits, (SplitFolders, ValSize))
    for dataset in (folder, cifar, digits):
        assert isinstance(dataset.num_workers, int)  # ImageSplits' loader workers (calibration)
    # `vit probe`'s hint names the option each one has
    assert test_split_hint(folder) == f"add a test/ folder next to {tmp_path}/train and val"
    assert test_split_hint(digits) == "set --data.test_fraction (e.g. 0.1)"
    assert test_split_hint(cifar).startswith("set --data.val_size")
    assert test_split_hint(object()) == "give the datamodule a test split apart from val"
