"""vit.features: pooled features, cached under the weights' and the dataset's fingerprints."""

from __future__ import annotations

import os
import stat

import numpy as np
import torch

import vit
from tests.helpers import TINY_DIM, tiny_vit
from vit.data.digits import DigitsSet
from vit.features import cached_features, weights_key


def digits_set(n: int = 12, seed: int = 0) -> DigitsSet:
    g = torch.Generator().manual_seed(seed)
    return DigitsSet(torch.rand(n, 1, 8, 8, generator=g), torch.arange(n) % 3, (0.3,), (0.4,), indices=range(5, 5 + n))


def test_cache_is_keyed_by_weights_and_data_and_written_with_the_umask(tmp_path):
    model, data = tiny_vit(depth=1, num_classes=3), digits_set()
    old = os.umask(0o027)
    try:
        first = cached_features(model, {}, data, "train", cache_dir=tmp_path)
    finally:
        os.umask(old)
    assert first[2].startswith("extracted, cached in")
    (path,) = tmp_path.iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    # The features are the model's own pooled pre-logits output, computed here independently.
    x = torch.stack([data[i][0] for i in range(len(data))])
    with torch.no_grad():
        expected = model.forward_head(model.forward_features(x), pre_logits=True)
    torch.testing.assert_close(first[0], expected)
    assert torch.equal(first[1], data.labels)

    again = cached_features(model, {}, data, "train", cache_dir=tmp_path)
    assert again[2] == f"loaded from cache {path}" and torch.equal(again[0], first[0])
    # Other weights, or other images: another key, extracted again.
    with torch.no_grad():
        model.blocks[0].mlp.fc1.weight.add_(0.1)
    assert cached_features(model, {}, data, "train", cache_dir=tmp_path)[2].startswith("extracted, cached")
    assert cached_features(model, {}, digits_set(seed=1), "train", cache_dir=tmp_path)[2].startswith("extracted")
    assert len(list(tmp_path.iterdir())) == 3
    # The head does not change the features, so it does not change the key.
    head_only = weights_key(model, {})
    with torch.no_grad():
        model.head.weight.add_(1.0)
    assert weights_key(model, {}) == head_only


def test_a_distilled_vits_second_head_is_a_head_to_the_cache_key_too():
    """The key asks the model which parameters are its head (`param_roles`): DeiT's head_dist reads the features as
    the head does, so a new probe head on a distilled ViT does not make its features stale."""
    model = vit.create_model("deit_tiny_distilled_patch16_224", img_size=16, patch_size=8, depth=1, embed_dim=TINY_DIM,
                             num_heads=2, num_classes=3)
    key = weights_key(model, {})
    with torch.no_grad():
        model.head_dist.weight.add_(1.0)
        model.head.bias.add_(1.0)
    assert weights_key(model, {}) == key
    with torch.no_grad():
        model.dist_token.add_(1.0)
    assert weights_key(model, {}) != key


def test_digits_items_are_named_by_their_place_in_load_digits():
    data = digits_set()
    assert data.item_name(0) == "digits[5]"
    raw = np.asarray(data.raw_image(3))
    assert raw.dtype == np.uint8 and raw.shape == (8, 8)
    np.testing.assert_array_equal(raw, np.round(data.images[3, 0].numpy() * 255))


def test_a_dataset_without_a_fingerprint_is_extracted_and_not_cached(tmp_path):
    plain = torch.utils.data.TensorDataset(torch.rand(4, 1, 8, 8), torch.zeros(4, dtype=torch.long))
    _, _, how = cached_features(tiny_vit(depth=1, num_classes=3), {}, plain, "val", cache_dir=tmp_path)
    assert how == "extracted (not cached: the dataset has no fingerprint())" and not list(tmp_path.iterdir())
