"""scripts/experiments/select_labels.py: LP-FT's start is the probe itself, and the validation slice the recipes were
compared on holds no chosen image; lpft_x10's steps grow with the chosen images."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from tests import load_script
from vit.nn.vision import create_model


@pytest.fixture(scope="module")
def script():
    return load_script("select_labels")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A headless random ViT of the script's model, saved as an encoder checkpoint (the MAE's stand-in)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("mae") / "encoder.pt"
    torch.save(create_model("vit_digits_patch4_16", num_classes=0).state_dict(), path)
    return path


@pytest.mark.parametrize("classes", [[0, 3, 4, 7], [2, 5]])  # softmax's rows; a binary fit's one decision
def test_lpft_starts_as_the_probe(script, encoder, classes):
    images = torch.rand(40, 1, 16, 16)
    labels = np.array(classes * 3)
    train, test = images[:len(labels)], images[len(labels):]
    pool_x = script.encode(encoder, images)  # the probe's features: their own model and loading
    scaler = StandardScaler().fit(pool_x)
    clf = LogisticRegression(C=1.0, max_iter=5000).fit(scaler.transform(pool_x[:len(labels)]), labels)
    model = script.classifier(script.RECIPES["lpft_1e-3"], encoder, train, labels, scaler, seed=0)
    model.eval()
    with torch.no_grad():
        logits = model(script.normalise(test)).double().numpy()
    expected = clf.predict_proba(scaler.transform(pool_x[len(labels):]))
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    np.testing.assert_allclose(probs[:, classes], expected, atol=1e-4)  # the same probabilities ...
    assert probs[:, np.setdiff1d(np.arange(10), classes)].max() < 1e-3  # ... and a class without a label has none


def test_a_random_head_is_not_the_probe(script, encoder):
    """The recipes without the probe's start leave the head as initialised (so the test above can tell)."""
    labels = np.array([0, 1, 2] * 2)
    model = script.classifier(script.RECIPES["ft_avg"], encoder, torch.rand(6, 1, 16, 16), labels,
                              StandardScaler().fit(np.random.default_rng(0).normal(size=(20, 64))), seed=0)
    assert model.model.head.weight.abs().max() < 0.1  # timm's head init: small, nothing fit


def test_the_validation_slice_is_fixed_and_holds_nothing_chosen(script):
    labels = np.arange(300) % 10
    taken = np.array([3, 17, 250])
    held = script.validation(labels, taken, size=100)
    assert len(held) == len(set(held.tolist())) == 100 and not np.isin(held, taken).any()
    assert np.array_equal(held, script.validation(labels, np.array([3, 17, 250]), size=100))  # the same draw
    assert len(script.validation(labels, taken, size=1000)) == 297  # all that is left, no more


def test_lpft_x10_steps_scale_with_the_chosen_images(script):
    assert [script.RECIPES["lpft_x10"].sized(n).steps for n in (10, 20, 50)] == [100, 200, 500]
    assert script.RECIPES["lpft_200"].sized(50).steps == 200  # a fixed recipe stays fixed
