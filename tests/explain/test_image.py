"""vit.explain.image: one image prepared for a trained classifier as `vit predict` prepares it, and its figure of
maps and rollout with the top classes (what `vit attention` draws, without the command)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tests.commands.test_attention import write_checkpoint
from tests.helpers import TINY_DIM
from vit.explain.image import DISPLAY_SIDE, NATIVE_MAX_PATCHES, explain_image, prepare_image

NAMES = ["cat", "dog", "fox"]


@pytest.fixture
def classifier(tmp_path):
    """An untrained RGB classifier of one block, 32 px at 4 px a patch, loaded as every command loads one."""
    from vit.deploy import load_classifier

    ckpt = tmp_path / "rgb.ckpt"
    write_checkpoint(ckpt, model_name="vit_cifar_patch4_32", num_classes=3, class_names=NAMES,
                     model_kwargs=dict(embed_dim=TINY_DIM, depth=2, num_heads=4))
    return load_classifier(ckpt)


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    return Image.fromarray((np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8))


def test_prepare_image_is_what_vit_predict_feeds_the_model(classifier):
    image = photo(50, 40)
    prepared = prepare_image(image, classifier)
    torch.testing.assert_close(prepared.tensor, classifier.eval_transform()(image)[None])
    assert prepared.display.shape == (DISPLAY_SIDE, DISPLAY_SIDE, 3)  # 32 px drawn larger
    assert prepared.display.min() >= 0.0 and prepared.display.max() <= 1.0


def test_native_size_scales_a_large_photo_down_to_the_patch_limit_keeping_its_shape(classifier):
    """A 6000 x 6000 photo at its own size was 140,625 patches at 16 px, and its attention asked for 40 TB."""
    for width, height in [(3000, 2000), (64, 40)]:  # 375,000 patches of 4 px; and a small one, kept as it is
        tensor = prepare_image(Image.new("RGB", (width, height)), classifier, native_size=True).tensor
        h, w = tensor.shape[-2] // 4, tensor.shape[-1] // 4
        if width * height // 16 <= NATIVE_MAX_PATCHES:
            assert (h, w) == (height // 4, width // 4)
        else:
            assert 0.95 * NATIVE_MAX_PATCHES < h * w <= NATIVE_MAX_PATCHES and abs(w / h - 1.5) < 0.05


def test_explain_image_draws_the_chosen_maps_and_gives_the_classifiers_top_classes(classifier):
    prepared = prepare_image(photo(32, 32), classifier)
    fig, top = explain_image(classifier.model, prepared, class_names=NAMES, top_k=2, title="photo.png")
    with torch.no_grad():
        expected = torch.softmax(classifier.model(prepared.tensor), dim=-1)[0]
    assert [p["class"] for p in top] == expected.argsort(descending=True)[:2].tolist()
    assert [p["name"] for p in top] == [NAMES[p["class"]] for p in top]
    np.testing.assert_allclose([p["probability"] for p in top], expected.sort(descending=True).values[:2], atol=1e-5)
    assert fig._suptitle.get_text() == f"photo.png: {top[0]['name']} ({top[0]['probability']:.0%})"
    grid = lambda figure: [ax for ax in figure.get_axes() if ax.get_images() and ax.get_title() != "input"
                           and "rollout" not in ax.get_title()]  # the layers x heads maps
    assert len(grid(fig)) == 2 * 4  # every layer x every head
    assert [ax.get_title() for ax in fig.get_axes() if "rollout" in ax.get_title()] == ["rollout (mean)"]

    fig, _ = explain_image(classifier.model, prepared, class_names=NAMES, layers=[-1], heads="mean", rollout="grad",
                           target=2)
    assert len(grid(fig)) == 1 and any(ax.get_title() == "grad rollout → fox" for ax in fig.get_axes())
    fig, _ = explain_image(classifier.model, prepared, class_names=NAMES, heads=[0, 3], rollout="none")
    assert len(grid(fig)) == 2 * 2
    assert not any(ax.get_images() and "rollout" in ax.get_title() for ax in fig.get_axes())
