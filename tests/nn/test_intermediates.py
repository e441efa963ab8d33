"""Dense features: timm's forward_intermediates / prune_intermediate_layers, FX tracing, grad checkpointing."""

import copy
import itertools

import pytest
import timm
import torch
from torchvision.models.feature_extraction import create_feature_extractor

import vit
from tests.helpers import TINY_DIM
from tests.nn.test_vision import perturb
from vit.nn.vision import VisionTransformer

OPTIONS = ["return_prefix_tokens", "norm", "stop_early", "intermediates_only"]


def flat(out) -> list[torch.Tensor]:
    """Every tensor of a (nested) forward_intermediates result, in order."""
    return [out] if isinstance(out, torch.Tensor) else [t for part in out for t in flat(part)]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, VisionTransformer]:
    """timm's vit_tiny_patch16_224 and ours on the same (perturbed) weights, non-square dynamic inputs."""
    theirs = perturb(timm.create_model("vit_tiny_patch16_224", num_classes=7, dynamic_img_size=True)).eval()
    ours = vit.create_model("vit_tiny_patch16_224", num_classes=7, dynamic_img_size=True).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return theirs, ours


def test_forward_intermediates_equals_timm_for_every_option(pair):
    theirs, ours = pair
    x = torch.randn(1, 3, 32, 48)  # a 2x3 patch grid: NCHW must follow the input, not the 14x14 default
    worst = 0.0
    with torch.no_grad():
        for indices, output_fmt, *flags in itertools.product(
            [None, 3, [0, -1], [5, 2]], ["NCHW", "NLC"], *[[False, True]] * len(OPTIONS)
        ):
            kwargs = dict(zip(OPTIONS, flags), indices=indices, output_fmt=output_fmt)
            want, got = flat(theirs.forward_intermediates(x, **kwargs)), flat(ours.forward_intermediates(x, **kwargs))
            assert [t.shape for t in got] == [t.shape for t in want], kwargs
            worst = max(worst, max((a - b).abs().max().item() for a, b in zip(want, got)))
            maps = [t for t in got if t.dim() == 4]
            assert len(maps) == (output_fmt == "NCHW") * len(ours.layer_indices(indices))
            assert all(t.shape[-2:] == (2, 3) for t in maps)
    assert worst <= 1e-5


def test_forward_intermediates_at_the_trained_size_and_its_errors(pair):
    theirs, ours = pair
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        final, maps = ours.forward_intermediates(x, indices=[-1], norm=True)
        want_final, want_maps = theirs.forward_intermediates(x, indices=[-1], norm=True)
    torch.testing.assert_close(final, want_final, atol=1e-5, rtol=0)
    torch.testing.assert_close(maps[0], want_maps[0], atol=1e-5, rtol=0)
    assert maps[0].shape == (1, 192, 14, 14)
    with pytest.raises(ValueError, match="output_fmt must be 'NCHW' or 'NLC'"):
        ours.forward_intermediates(x, output_fmt="NHWC")
    with pytest.raises(ValueError, match="layer 12 does not exist"):
        ours.forward_intermediates(x, indices=[12])
    with pytest.raises(ValueError, match="last 13 layers"):
        ours.forward_intermediates(x, indices=13)


@pytest.mark.parametrize("kwargs", [dict(indices=[1, 3]), dict(indices=2, prune_norm=True, prune_head=False)])
def test_prune_intermediate_layers_equals_timm(pair, kwargs):
    theirs, ours = map(copy.deepcopy, pair)
    assert ours.prune_intermediate_layers(**kwargs) == theirs.prune_intermediate_layers(**kwargs)
    assert len(ours.blocks) == len(theirs.blocks)
    for name in ("norm", "fc_norm", "head"):
        identity = torch.nn.Identity
        assert isinstance(getattr(ours, name), identity) == isinstance(getattr(theirs, name), identity), name
    x = torch.randn(2, 3, 48, 32)
    with torch.no_grad():
        want = flat(theirs.forward_intermediates(x, indices=kwargs["indices"], norm=True))
        got = flat(ours.forward_intermediates(x, indices=kwargs["indices"], norm=True))
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    if kwargs.get("prune_head", True):
        assert ours(x).shape == (2, 192)  # pooled features (timm returns all tokens here)


# torchvision notes that eval-mode nodes are a subset of train-mode ones: the test traces both on purpose.
@pytest.mark.filterwarnings("ignore:NOTE. The nodes obtained by tracing:UserWarning")
def test_fx_feature_extractor_traces_and_equals_eager():
    """torchvision's create_feature_extractor (train and eval graphs, drop path on) gives the eager blocks."""
    model = perturb(VisionTransformer(img_size=32, patch_size=8, embed_dim=TINY_DIM, depth=3, num_heads=4,
                                      num_classes=5, drop_path_rate=0.2, dynamic_img_size=True))
    nodes = {f"blocks.{i}": f"b{i}" for i in range(3)} | {"norm": "norm", "head": "logits"}
    extractor = create_feature_extractor(model, return_nodes=nodes).eval()
    model.eval()
    for x in (torch.randn(2, 3, 32, 32), torch.randn(2, 3, 24, 40)):  # the trained grid, and another one
        traced = extractor(x)
        eager = model.forward_intermediates(x, output_fmt="NLC", return_prefix_tokens=True, intermediates_only=True)
        for i in range(2):  # forward() updates only the cls token in the last block: compare that one below
            torch.testing.assert_close(traced[f"b{i}"], torch.cat(eager[i][::-1], dim=1), atol=0, rtol=0)
        torch.testing.assert_close(traced["b2"], eager[2][1], atol=1e-6, rtol=0)
        torch.testing.assert_close(traced["logits"], model(x), atol=0, rtol=0)
    with pytest.raises(ValueError, match="not divisible by the patch size"):
        extractor(torch.randn(1, 3, 30, 32))  # the shape check runs inside the traced graph too
    model.train()
    torch.manual_seed(0)
    train_extractor = create_feature_extractor(model, return_nodes={"head": "logits"})
    torch.manual_seed(1)
    a = train_extractor(x)["logits"]
    torch.manual_seed(1)
    torch.testing.assert_close(a, model(x), atol=0, rtol=0)  # the same drop-path draws


def test_grad_checkpointing_gives_the_same_loss_and_gradients_and_keeps_less():
    torch.manual_seed(0)
    model = perturb(VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=4, num_heads=4,
                                      num_classes=5, drop_path_rate=0.3)).train()
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 5, (8,))

    def step(checkpointing: bool) -> tuple[torch.Tensor, list[torch.Tensor], int]:
        model.set_grad_checkpointing(checkpointing)
        saved = []  # bytes autograd keeps for the backward pass
        torch.manual_seed(3)  # the same drop-path draws; checkpointing must replay them in the recompute
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.nbytes) or t, lambda t: t):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        return loss, torch.autograd.grad(loss, list(model.parameters())), sum(saved)

    plain_loss, plain_grads, plain_saved = step(False)
    loss, grads, saved = step(True)
    assert abs(loss.item() - plain_loss.item()) <= 1e-6
    assert max((a - b).abs().max().item() for a, b in zip(grads, plain_grads)) <= 1e-6
    assert saved < 0.5 * plain_saved
    model.set_grad_checkpointing(False)
    assert not model.grad_checkpointing
