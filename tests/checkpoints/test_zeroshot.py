"""The zero-shot head: open_clip's build_zero_shot_classifier's logits, in an ordinary classify checkpoint."""

from __future__ import annotations

import pytest
import torch

from tests.openclip import tiny_openclip, write_openclip_folder
from vit.checkpoints.clip import load_clip
from vit.checkpoints.zeroshot import class_embeddings, class_names, zero_shot_checkpoint
from vit.deploy.classifier import read_classifier
from vit.errors import UserValueError

CLASSES = ["cat", "dog", "red car", "oak tree", "São Paulo"]
TEMPLATES = ("a photo of a {}.", "a blurry photo of the {}.", "art of the {}", "{}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model, cfg = tiny_openclip()
    return model, write_openclip_folder(model, cfg, tmp_path_factory.mktemp("zs") / "clip")


def test_zero_shot_logits_equal_open_clips(folder, tmp_path):
    from open_clip import get_tokenizer
    from open_clip.zero_shot_classifier import build_zero_shot_classifier

    reference, path = folder
    loaded = load_clip(path)
    with torch.no_grad():
        weights = build_zero_shot_classifier(reference, get_tokenizer("ViT-B-32"), CLASSES,
                                             [lambda c, t=t: t.format(c) for t in TEMPLATES], num_classes_per_batch=2,
                                             device="cpu", use_tqdm=False)  # (E, C)
        images = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        want = reference.logit_scale.exp() * reference.encode_image(images, normalize=True) @ weights
        assert torch.allclose(class_embeddings(loaded.model, loaded.tokenizer, CLASSES, TEMPLATES, batch_size=3),
                              weights.T, atol=1e-5)
        torch.save(zero_shot_checkpoint(loaded, CLASSES, TEMPLATES), tmp_path / "zs.ckpt")
        classifier = read_classifier(tmp_path / "zs.ckpt")
        assert classifier.class_names == CLASSES
        assert classifier.mean == pytest.approx((0.48145466, 0.4578275, 0.40821073))
        assert torch.allclose(classifier(images), want, atol=1e-4, rtol=0)


def test_one_template_differs_from_four(folder):
    """The averaging is real: the head of one template is another head (the test above can fail)."""
    _, path = folder
    loaded = load_clip(path)
    four = class_embeddings(loaded.model, loaded.tokenizer, CLASSES, TEMPLATES)
    one = class_embeddings(loaded.model, loaded.tokenizer, CLASSES, TEMPLATES[:1])
    assert (four - one).abs().max() > 1e-3


def test_class_names_are_checked():
    assert class_names([" oak", "maple ", "", "birch"]) == ["oak", "maple", "birch"]
    with pytest.raises(UserValueError, match="class list is empty"):
        class_names(["", "  "])
    with pytest.raises(UserValueError, match="given twice: oak"):
        class_names(["oak", "oak"])


def test_the_zero_shot_checkpoint_says_what_a_trained_classifiers_says(folder):
    """One writer of a classifier's ``checkpoint["vit"]`` (`classify_meta`): the zero-shot file holds the same
    entries as `vit fit`'s, so every reader finds them."""
    from tests.helpers import tiny_classifier

    _, path = folder
    meta = zero_shot_checkpoint(load_clip(path), CLASSES, TEMPLATES[:1])["vit"]
    assert set(meta) == set(tiny_classifier().checkpoint_meta())
    assert meta["task"] == "classify" and meta["ema"] is False and meta["class_names"] == CLASSES
