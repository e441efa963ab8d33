"""The bundled digits DataModule."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from vit.data.digits import Digits
from vit.data.io import stratified_split


def test_digits_split_sizes_batches_and_metadata():
    dm = Digits(batch_size=32)
    # known before setup, so the CLI can link them into the model
    assert (dm.num_classes, dm.img_size, dm.in_chans) == (10, 8, 1)
    assert dm.class_names == [str(i) for i in range(10)]
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (1259, 179, 359)
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (32, 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    # the eval images are the scikit-learn pixels / 16, normalised
    from sklearn.datasets import load_digits

    digits = load_digits()
    _, val_idx, test_idx = stratified_split(digits.target, [0.1, 0.2], seed=0)
    expected = (torch.tensor(digits.images[val_idx[:32]], dtype=torch.float32) / 16 - 0.3053) / 0.3760
    torch.testing.assert_close(x[:, 0], expected)
    assert Counter(digits.target[test_idx].tolist()) == Counter(
        dm.test_set.labels.tolist()
    )
    # training images are augmented (shifted/rotated), so two draws differ
    a, b = dm.train_set[0][0], dm.train_set[0][0]
    assert not torch.equal(a, b)
    # upsampled digits keep the split and their mean brightness
    big = Digits(img_size=16, max_shift=0, max_rotation=0, zoom=(1, 1))
    big.setup("fit")
    x16 = big.val_set[0][0]
    assert x16.shape == (1, 16, 16) and big.img_size == 16
    assert x16.mean().item() == pytest.approx(dm.val_set[0][0].mean().item(), abs=0.1)
    with pytest.raises(ValueError, match="at least the native 8"):
        Digits(img_size=4)
