"""Attention maps, rollout and the `vit attention` command (vit.explain)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import vit
from tests.helpers import TINY_DIM, tiny_vit
from vit.explain.maps import (
    attention_rollout,
    cls_attention_maps,
    collect_attention,
    gradient_rollout,
    mean_attention_distance,
    rollout_layer,
    rollout_matrix,
    rollout_streaming,
)
from vit.nn.vision import VisionTransformer

HEADS = dict(num_heads=4, num_classes=5)  # depth 2, dim 32, 4 heads on 8x8 grayscale: 4x4 patches + cls


def random_attention(layers: int, batch: int, heads: int, tokens: int, seed: int = 0) -> Tensor:
    """Softmax rows with very different column sums, so a wrong-axis normalisation would show."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(layers, batch, heads, tokens, tokens, generator=g) * 3
    return scores.softmax(dim=-1)


# --- the weights path ----------------------------------------------------------------------------


def test_weights_path_gives_the_fused_paths_output():
    model = tiny_vit(**HEADS)
    images = torch.randn(3, 1, 8, 8)
    maps = collect_attention(model, images)
    with torch.no_grad():
        fused = model(images)  # SDPA in every block, cls-only last block
    torch.testing.assert_close(maps.logits, fused, atol=1e-5, rtol=1e-5)
    assert maps.weights.shape == (2, 3, 4, 17, 17)
    torch.testing.assert_close(maps.weights.sum(-1), torch.ones(2, 3, 4, 17))

    # Block by block too: the explicit path's tokens equal SDPA's.
    with torch.no_grad():
        x = model.embed(images)
        for block in model.blocks:
            explicit, _ = block(x, return_attention=True)
            torch.testing.assert_close(explicit, block(x), atol=1e-5, rtol=1e-5)
            x = explicit


def test_weights_match_torch_multihead_attention():
    model = tiny_vit(**HEADS)
    images = torch.randn(2, 1, 8, 8)
    maps = collect_attention(model, images, layers=[0])
    block = model.blocks[0]
    reference = nn.MultiheadAttention(32, 4, batch_first=True)
    with torch.no_grad():
        reference.in_proj_weight.copy_(block.attn.qkv.weight)
        reference.in_proj_bias.copy_(block.attn.qkv.bias)
        reference.out_proj.weight.copy_(block.attn.proj.weight)
        reference.out_proj.bias.copy_(block.attn.proj.bias)
        h = block.norm1(model.embed(images))
        _, expected = reference(h, h, h, need_weights=True, average_attn_weights=False)  # (B, H, N, N)
    torch.testing.assert_close(maps.weights[0], expected, atol=1e-6, rtol=1e-5)


def test_layer_subset_keeps_only_those_layers():
    model = tiny_vit(**HEADS, depth=3)
    images = torch.randn(2, 1, 8, 8)
    full = collect_attention(model, images)
    last = collect_attention(model, images, layers=[-1])
    assert last.layers == [2] and last.weights.shape[0] == 1
    torch.testing.assert_close(last.weights[0], full.weights[2])
    torch.testing.assert_close(last.logits, full.logits)
    with pytest.raises(ValueError, match="rollout multiplies through all 3 layers"):
        last.rollout()
    with pytest.raises(ValueError, match="layer 3 does not exist"):
        collect_attention(model, images, layers=[3])


def test_only_the_chosen_layers_take_the_explicit_path():
    # Memory: the other layers stay on SDPA, which never builds the (N, N) weights.
    model = tiny_vit(**HEADS, depth=4)
    explicit = []

    def record(layer):
        def hook(module, args, kwargs, out):
            if kwargs.get("return_attention"):
                explicit.append(layer)

        return hook

    for i, block in enumerate(model.blocks):
        block.attn.register_forward_hook(record(i), with_kwargs=True)
    collect_attention(model, torch.randn(1, 1, 8, 8), layers=[-1, 1])
    assert explicit == [1, 3]


def test_bad_images_are_refused_with_the_expected_shape():
    model = tiny_vit(**HEADS)
    with pytest.raises(ValueError, match="1-channel"):
        collect_attention(model, torch.randn(1, 3, 8, 8))
    with pytest.raises(ValueError, match="expected a 8x8 input"):
        collect_attention(model, torch.randn(1, 1, 12, 8))


def test_dynamic_image_size_gives_maps_on_the_new_grid():
    model = tiny_vit(**HEADS, dynamic_img_size=True)
    maps = collect_attention(model, torch.randn(1, 1, 12, 16))
    assert maps.grid == (6, 8)
    assert maps.cls_maps().shape == (2, 1, 4, 6, 8)
    assert maps.rollout().shape == (1, 6, 8)


@pytest.mark.parametrize(
    "name", ["vit_digits_patch2_8", "vit_cifar_patch4_32", "vit_tiny_patch16_224", "vit_base_patch32_224",
             "vit_small_patch16_384"],
)
def test_maps_for_named_models(name):
    # One block of each (the number of layers does not change the shapes); the big ones differ only in width.
    torch.manual_seed(0)
    model = vit.create_model(name, depth=1).eval()
    images = torch.randn(1, model.patch_embed.proj.in_channels, *model.img_size)
    maps = collect_attention(model, images)
    assert maps.cls_maps().shape == (1, 1, model.blocks[0].attn.num_heads, *model.patch_embed.grid_size)
    assert maps.rollout().shape == (1, *model.patch_embed.grid_size)


def test_average_pooled_model_maps_follow_the_patches():
    model = tiny_vit(**HEADS, global_pool="avg")
    maps = collect_attention(model, torch.randn(2, 1, 8, 8))
    torch.testing.assert_close(maps.cls_maps().flatten(-2), maps.weights[..., 1:, 1:].mean(dim=-2))
    product = rollout_matrix([rollout_layer(w) for w in maps.weights])
    torch.testing.assert_close(maps.rollout().flatten(-2), product[:, 1:, 1:].mean(dim=-2))


def test_model_mode_is_restored_and_dropout_is_off_while_explaining():
    model = tiny_vit(**HEADS, attn_drop_rate=0.5).train()
    images = torch.randn(2, 1, 8, 8)
    first, second = collect_attention(model, images), collect_attention(model, images)
    assert model.training
    torch.testing.assert_close(first.logits, second.logits)
    _, rolled = rollout_streaming(model, images)
    assert model.training
    torch.testing.assert_close(rolled, first.rollout())


# --- per-layer maps and prefix tokens ----------------------------------------------------------------


def test_register_tokens_are_left_out_of_the_maps():
    torch.manual_seed(0)
    model = VisionTransformer(  # two register tokens after the cls token (Darcet et al., 2024)
        img_size=8, patch_size=2, in_chans=1, num_classes=3, embed_dim=TINY_DIM, depth=2, num_heads=4, reg_tokens=2
    ).eval()
    assert model.num_prefix_tokens == 3
    maps = collect_attention(model, torch.randn(2, 1, 8, 8))
    assert maps.weights.shape[-1] == 3 + 16
    cls_maps = maps.cls_maps()
    assert cls_maps.shape == (2, 2, 4, 4, 4)
    torch.testing.assert_close(cls_maps.flatten(-2), maps.weights[..., 0, 3:])
    assert maps.rollout().shape == (2, 4, 4)


def test_average_pooled_model_maps_the_patch_rows():
    weights = random_attention(1, 1, 2, 5)
    maps = cls_attention_maps(weights, (2, 2), num_prefix_tokens=1, global_pool="avg")
    torch.testing.assert_close(maps.flatten(-2), weights[..., 1:, 1:].mean(dim=-2))


def test_dinov2_cls_and_patch_mean_model_maps_the_cls_row():
    weights = random_attention(1, 1, 2, 5)
    maps = cls_attention_maps(weights, (2, 2), num_prefix_tokens=1, global_pool="token_avg")
    torch.testing.assert_close(maps.flatten(-2), weights[..., 0, 1:])


# --- rollout -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head_fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard_ratio", [0.0, 0.5, 0.9])
def test_each_rollout_row_sums_to_one(head_fusion, discard_ratio):
    weights = random_attention(3, 2, 4, 10)
    layers = [rollout_layer(w, head_fusion, discard_ratio) for w in weights]
    for layer in layers:
        assert (layer >= 0).all()
        torch.testing.assert_close(layer.sum(dim=-1), torch.ones(2, 10))
    product = rollout_matrix(layers)
    torch.testing.assert_close(product.sum(dim=-1), torch.ones(2, 10))
    # Columns do not sum to 1: had the wrong axis been normalised, the rows would not either.
    assert not torch.allclose(product.sum(dim=-2), torch.ones(2, 10), atol=1e-2)


def test_rollout_matches_abnar_and_zuidema_by_hand():
    weights = random_attention(3, 1, 2, 5, seed=3)
    expected = np.eye(5)
    for w in weights.numpy():
        a = 0.5 * w[0].mean(axis=0) + 0.5 * np.eye(5)  # heads averaged, then the residual
        expected = a @ expected
    heat = attention_rollout(weights, (2, 2), num_prefix_tokens=1)
    np.testing.assert_allclose(heat[0].flatten().numpy(), expected[0, 1:], rtol=1e-5)


def test_discard_never_drops_cls_to_cls():
    weights = torch.full((1, 1, 5, 5), 0.2)
    weights[0, 0, 0] = torch.tensor([0.01, 0.3, 0.25, 0.35, 0.09])  # cls->cls is the row's smallest
    layer = rollout_layer(weights, discard_ratio=0.5)  # drops the 2 lowest of each row
    # Row 0 keeps cls->cls (0.01) and drops the next two lowest, 0.09 and 0.25.
    kept = torch.tensor([0.01, 0.3, 0.0, 0.35, 0.0])
    expected = 0.5 * kept / kept.sum() + 0.5 * torch.eye(5)[0]
    torch.testing.assert_close(layer[0, 0], expected)
    with pytest.raises(ValueError, match="discard_ratio"):
        rollout_layer(weights, discard_ratio=1.0)
    with pytest.raises(ValueError, match="head_fusion"):
        rollout_layer(weights, head_fusion="median")


def test_streaming_rollout_equals_rollout_from_stored_weights():
    model = tiny_vit(**HEADS, depth=3)
    images = torch.randn(2, 1, 8, 8)
    maps = collect_attention(model, images)
    for fusion in ("mean", "max"):
        logits, heat = rollout_streaming(model, images, head_fusion=fusion, discard_ratio=0.3)
        torch.testing.assert_close(heat, maps.rollout(fusion, 0.3))
        torch.testing.assert_close(logits, maps.logits)


def test_gradient_rollout_depends_on_the_target_class():
    model = tiny_vit(**HEADS)
    for p in model.parameters():  # frozen parameters must not stop the gradients to the weights
        p.requires_grad_(False)
    images = torch.randn(2, 1, 8, 8)
    logits, toward_0 = gradient_rollout(model, images, target=0)
    _, toward_3 = gradient_rollout(model, images, target=[3, 3])
    _, predicted = gradient_rollout(model, images)
    _, predicted_explicitly = gradient_rollout(model, images, target=logits.argmax(-1))
    assert toward_0.shape == (2, 4, 4) and (toward_0 >= 0).all()
    assert not torch.allclose(toward_0, toward_3)
    torch.testing.assert_close(predicted, predicted_explicitly)
    with pytest.raises(ValueError, match="out of range for 5 classes"):
        gradient_rollout(model, images, target=5)
    with pytest.raises(ValueError, match="3 classes for 2 images"):
        gradient_rollout(model, images, target=[1, 2, 3])


def test_gradient_rollout_keeps_only_positive_relevance():
    # One layer, rebuilt by hand as the reference: the layer matrix is relu(grad * attention)
    # averaged over heads, rows renormalised, mixed half-and-half with the identity.
    model = tiny_vit(**HEADS, depth=1)
    images = torch.randn(1, 1, 8, 8)
    block = model.blocks[0]
    x = model.embed(images)
    attn_out, w = block.attn(block.norm1(x), return_attention=True)
    w.retain_grad()
    y = x + attn_out
    y = y + block.mlp(block.norm2(y))
    logits = model.forward_head(model.norm(y))
    target = int(logits.argmax())
    logits[0, target].backward()
    relevance = (w.grad * w).clamp(min=0).mean(dim=1)[0]  # (N, N)
    expected = 0.5 * relevance[0, 1:] / relevance[0].sum()  # cls row over the patches
    _, heat = gradient_rollout(model, images, target=target)
    torch.testing.assert_close(heat[0].flatten(), expected.detach(), atol=1e-6, rtol=1e-4)


# --- a model built to look at one known patch ---------------------------------------------------------


def looking_model(alpha: float = 1.0) -> VisionTransformer:
    """Every head of every layer sends the cls token to the one bright patch of the image.

    The patch embedding writes a patch's pixel sum into channel 0 and the cls token is channel 1;
    each head's query reads channel 1 and its key reads channel 0, so only the cls query meets
    a key, that of the bright patch. Value, output and MLP projections are zero, so the tokens
    (and the attention) stay the same through the layers.
    """
    model = vit.create_model(
        "vit_digits_patch2_8", embed_dim=TINY_DIM, depth=3, num_heads=4, num_classes=2, dynamic_img_size=True
    ).eval()
    dim, head_dim = 32, 8
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in [model.norm] + [m for b in model.blocks for m in (b.norm1, b.norm2)]:
            norm.weight.fill_(1.0)
        model.patch_embed.proj.weight[0].fill_(1.0)  # channel 0 <- the patch's pixel sum
        model.cls_token[0, 0, 1] = 1.0
        for block in model.blocks:
            for head in range(4):
                block.attn.qkv.weight[head * head_dim, 1] = alpha  # query <- channel 1
                block.attn.qkv.weight[dim + head * head_dim, 0] = 1.0  # key <- channel 0
    return model


@pytest.mark.parametrize(("size", "patch"), [((8, 8), (0, 0)), ((8, 8), (2, 3)), ((12, 16), (4, 6))])
def test_map_peaks_on_the_patch_the_model_looks_at(size, patch):
    model = looking_model()
    image = torch.zeros(1, 1, *size)
    row, col = patch
    image[..., 2 * row : 2 * row + 2, 2 * col : 2 * col + 2] = 1.0  # patches are 2x2
    maps = collect_attention(model, image)
    grid_cols = size[1] // 2
    peak = row * grid_cols + col
    cls_maps = maps.cls_maps()  # (L, 1, H, h, w)
    assert (cls_maps.flatten(-2).argmax(-1) == peak).all()
    assert cls_maps.flatten(-2)[..., peak].min() > 0.9
    heat = maps.rollout()[0].flatten()
    assert int(heat.argmax()) == peak
    assert heat[peak] > 5 * heat[torch.arange(heat.numel()) != peak].max()
    _, streamed = rollout_streaming(model, image, head_fusion="max", discard_ratio=0.5)
    assert int(streamed[0].flatten().argmax()) == peak


def test_mean_attention_distance_of_local_and_global_heads():
    grid, tokens = (3, 3), 10
    local = torch.eye(tokens).expand(1, 1, 1, tokens, tokens)  # each patch attends to itself
    spread = torch.full((1, 1, 1, tokens, tokens), 1.0 / tokens)  # uniform attention
    weights = torch.cat([local, spread], dim=2)  # (L=1, B=1, H=2, N, N)
    distance = mean_attention_distance(weights, grid, num_prefix_tokens=1, patch_size=4)
    coords = torch.tensor([(r, c) for r in range(3) for c in range(3)], dtype=torch.float) * 4
    expected_spread = torch.cdist(coords, coords).mean()
    torch.testing.assert_close(distance, torch.stack([torch.tensor(0.0), expected_spread])[None])


# --- drawing ------------------------------------------------------------------------------------------


# --- `vit attention` ----------------------------------------------------------------------------------




def test_siglip_map_comes_from_the_attention_pool():
    """No cls token: the map is the attention pool's latent query over the last block's patches."""
    torch.manual_seed(0)
    model = VisionTransformer(img_size=8, patch_size=2, in_chans=1, num_classes=3, embed_dim=TINY_DIM, depth=2,
                              num_heads=4, class_token=False, global_pool="map").eval()
    images = torch.randn(2, 1, 8, 8)
    maps = collect_attention(model, images)
    assert maps.num_prefix_tokens == 0 and maps.weights.shape[-1] == 16
    pool = maps.pool_map()
    assert pool.shape == (2, 4, 4, 4)
    torch.testing.assert_close(pool.sum(dim=(-2, -1)), torch.ones(2, 4))
    # the same weights by hand: the latent's query against the keys of the final tokens
    tokens = model.forward_features(images)
    ap = model.attn_pool
    q = ap.q(ap.latent).reshape(1, 1, 4, 8).transpose(1, 2)  # (1, H, 1, d)
    k = ap.kv(tokens)[..., :32].reshape(2, 16, 4, 8).transpose(1, 2)  # (B, H, N, d)
    by_hand = ((q @ k.transpose(-2, -1)) * 8**-0.5).softmax(dim=-1)[:, :, 0]
    torch.testing.assert_close(pool.flatten(-2), by_hand)
    torch.testing.assert_close(maps.logits, model(images))
    with pytest.raises(ValueError, match="cls_maps"):
        collect_attention(VisionTransformer(img_size=8, patch_size=2, in_chans=1, embed_dim=TINY_DIM, depth=1,
                                            num_heads=4), images).pool_map()
