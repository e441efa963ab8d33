"""MAE's pieces (vit/nn/mae.py, vit.tasks.MaskedAutoencoder) against hand computations: loops over patches,
numpy statistics and the sin-cos formula written out, on tiny models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers import TINY, TINY_DIM, tiny_mae
from vit import create_model
from vit.checkpoints.weights import load_pretrained
from vit.errors import UserValueError
from vit.nn.mae import (
    MAEDecoder,
    encode_visible,
    normalize_patches,
    num_visible,
    patchify,
    random_masking,
    reconstruction_loss,
    sincos_pos_embed,
    take_tokens,
    unpatchify,
)

P16 = "vit_digits_patch4_16"  # 16x16 images in a 4x4 grid of 4x4 patches: the hand loops below count on it
AT16 = dict(model=P16, img_size=16)


def test_patchify_cuts_patches_row_by_row_and_unpatchify_inverts_it():
    images = torch.randn(2, 3, 8, 12)
    patches = patchify(images, (4, 3))  # a 2x4 grid of 4x3 patches
    assert patches.shape == (2, 8, 4 * 3 * 3)
    for b in range(2):
        for i in range(2):
            for j in range(4):
                by_hand = images[b, :, 4 * i:4 * i + 4, 3 * j:3 * j + 3].permute(1, 2, 0).flatten()  # row, col, chan
                assert torch.equal(patches[b, 4 * i + j], by_hand)
    assert torch.equal(unpatchify(patches, (4, 3), (2, 4)), images)


@pytest.mark.parametrize(("patches", "ratio"), [(16, 0.75), (196, 0.75), (196, 0.6), (10, 0.75), (49, 0.9)])
def test_each_image_keeps_round_n_times_one_minus_ratio_patches(patches, ratio):
    visible = num_visible(patches, ratio)
    assert visible == round(patches * (1 - ratio))
    masking = random_masking(8, patches, visible)
    assert masking.keep.shape == (8, visible)
    assert (masking.mask.sum(dim=1) == patches - visible).all()
    for keep, mask in zip(masking.keep, masking.mask):
        assert len(set(keep.tolist())) == visible  # distinct patches
        assert (mask[keep] == 0).all()  # the kept ones are the unmasked ones


def test_the_masking_is_drawn_per_image_and_reproduced_by_the_seed():
    torch.manual_seed(3)
    first = random_masking(16, 196, 49)
    torch.manual_seed(3)
    again = random_masking(16, 196, 49)
    assert torch.equal(first.keep, again.keep) and torch.equal(first.mask, again.mask)
    assert len({tuple(sorted(k.tolist())) for k in first.keep}) == 16  # every image its own choice
    generator = lambda: torch.Generator().manual_seed(5)
    assert torch.equal(random_masking(4, 16, 4, generator=generator()).keep,
                       random_masking(4, 16, 4, generator=generator()).keep)
    torch.manual_seed(4)
    assert not torch.equal(random_masking(16, 196, 49).keep, first.keep)


def test_restore_puts_kept_and_masked_tokens_back_in_patch_order():
    masking = random_masking(3, 10, 4)
    for keep, restore, mask in zip(*masking):
        assert sorted(restore.tolist()) == list(range(10))  # a permutation
        for j, patch in enumerate(keep.tolist()):
            assert restore[patch] == j  # the j-th encoder token goes back to its patch
        assert torch.equal(mask.bool(), restore >= 4)  # every other patch takes a mask token


def test_norm_pix_targets_match_numpy():
    patches = torch.randn(2, 5, 48) * 3 + 1
    normalised, mean, std = normalize_patches(patches)
    for b in range(2):
        for n in range(5):
            v = patches[b, n].double().numpy()
            by_hand = (v - v.mean()) / np.sqrt(v.var(ddof=1) + 1e-6)  # MAE: unbiased variance
            np.testing.assert_allclose(normalised[b, n].double().numpy(), by_hand, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(normalised * std + mean, patches)


def test_the_loss_counts_the_masked_patches_only():
    pred, target = torch.randn(2, 6, 4), torch.randn(2, 6, 4)
    mask = torch.tensor([[1, 0, 1, 0, 0, 1], [0, 1, 1, 1, 0, 0]], dtype=torch.float32)
    by_hand = [((pred[b, n] - target[b, n]) ** 2).mean() for b in range(2) for n in range(6) if mask[b, n]]
    loss = reconstruction_loss(pred, target, mask)
    torch.testing.assert_close(loss, torch.stack(by_hand).mean())
    changed = pred.clone()
    changed[mask == 0] += 100.0  # wrong everywhere the encoder could see: no effect
    assert reconstruction_loss(changed, target, mask) == loss
    changed[0, 0] += 1.0  # a masked patch: an effect
    assert reconstruction_loss(changed, target, mask) != loss


def test_the_task_loss_is_the_hand_computed_norm_pix_loss_on_the_masked_patches():
    task = tiny_mae(**AT16)
    images = torch.randn(3, 1, 16, 16)
    loss, pred, mask = task(images, torch.Generator().manual_seed(0))
    assert (mask.sum(1) == 12).all()  # 16 patches, 4 visible
    total, count = 0.0, 0
    for b in range(3):
        for i in range(4):
            for j in range(4):
                if not mask[b, 4 * i + j]:
                    continue
                v = images[b, 0, 4 * i:4 * i + 4, 4 * j:4 * j + 4].flatten().double().numpy()
                target = (v - v.mean()) / np.sqrt(v.var(ddof=1) + 1e-6)
                total += float(((pred[b, 4 * i + j].double().detach().numpy() - target) ** 2).mean())
                count += 1
    assert count == 36
    assert loss.item() == pytest.approx(total / count, rel=1e-5)
    plain = tiny_mae(**AT16, norm_pix_loss=False)
    plain.load_state_dict(task.state_dict())
    raw_loss, raw_pred, raw_mask = plain(images, torch.Generator().manual_seed(0))
    torch.testing.assert_close(raw_pred, pred)  # the same network and mask: only the target differs
    target = patchify(images, (4, 4))
    torch.testing.assert_close(raw_loss, ((raw_pred - target) ** 2).mean(-1)[raw_mask.bool()].mean())


def capture_input(module: torch.nn.Module) -> list[torch.Tensor]:
    """What ``module`` receives on its next calls (a forward pre-hook, for the test only)."""
    seen: list[torch.Tensor] = []
    module.register_forward_pre_hook(lambda _, args: seen.append(args[0].detach().clone()))
    return seen


def test_the_encoder_sees_the_kept_patches_with_their_own_positions():
    encoder = create_model(P16, num_classes=0, **TINY).eval()
    torch.nn.init.normal_(encoder.pos_embed)
    seen = capture_input(encoder.blocks[0])
    images = torch.randn(2, 1, 16, 16)
    latent, masking = encode_visible(encoder, images, 4)
    assert latent.shape == (2, 5, 32)
    tokens = encoder.patch_embed(images)  # (B, 16, D), patch order
    for b in range(2):
        torch.testing.assert_close(seen[0][b, 0], encoder.cls_token[0, 0] + encoder.pos_embed[0, 0])
        for j, patch in enumerate(masking.keep[b].tolist()):
            torch.testing.assert_close(seen[0][b, 1 + j], tokens[b, patch] + encoder.pos_embed[0, 1 + patch])


def test_the_decoder_puts_every_token_back_at_its_patch_with_its_position():
    decoder = MAEDecoder(embed_dim=TINY_DIM, grid_size=(4, 4), patch_size=(4, 4), in_chans=1, decoder_dim=16,
                         decoder_depth=1, decoder_heads=2).eval()
    torch.nn.init.normal_(decoder.mask_token)
    seen = capture_input(decoder.blocks)
    masking = random_masking(2, 16, 4)
    latent = torch.randn(2, 5, 32)
    pred = decoder(latent, masking.restore)
    assert pred.shape == (2, 16, 16)
    embedded, pos = decoder.embed(latent), decoder.pos_embed[0]
    for b in range(2):
        kept = masking.keep[b].tolist()
        torch.testing.assert_close(seen[0][b, 0], embedded[b, 0] + pos[0])
        for patch in range(16):
            token = embedded[b, 1 + kept.index(patch)] if patch in kept else decoder.mask_token[0, 0]
            torch.testing.assert_close(seen[0][b, 1 + patch], token + pos[1 + patch])


def test_sincos_positions_follow_the_formula():
    dim, (h, w) = 16, (3, 5)
    pos = sincos_pos_embed(dim, (h, w))
    assert pos.shape == (1, 1 + h * w, dim) and torch.equal(pos[0, 0], torch.zeros(dim))  # the cls token: none
    quarter = dim // 4
    for r in range(h):
        for c in range(w):
            by_hand = []
            for coord in (c, r):  # the first half encodes the column, the second the row
                freqs = [1 / 10000 ** (k / quarter) for k in range(quarter)]
                by_hand += [math.sin(coord * f) for f in freqs] + [math.cos(coord * f) for f in freqs]
            torch.testing.assert_close(pos[0, 1 + r * w + c], torch.tensor(by_hand, dtype=torch.float32))


def test_the_encoder_position_embedding_starts_at_sincos_and_stays_fixed():
    task = tiny_mae(**AT16)
    fixed = task.model.pos_embed.detach().clone()
    torch.testing.assert_close(fixed, sincos_pos_embed(32, (4, 4)))
    optimizer = torch.optim.AdamW([p for p in task.parameters() if p.requires_grad], lr=0.1)
    task(torch.randn(4, 1, 16, 16))[0].backward()
    optimizer.step()
    assert torch.equal(task.model.pos_embed, fixed)
    assert tiny_mae(**AT16, fixed_pos_embed=False).model.pos_embed.requires_grad


def test_the_encoder_weights_load_into_a_classifier_with_every_key_checked(tmp_path):
    task = tiny_mae(**AT16)
    path = tmp_path / "mae.ckpt"
    torch.save({"state_dict": task.state_dict(), "vit": task.checkpoint_meta()}, path)
    classifier = create_model(P16, num_classes=10, **TINY)
    result = load_pretrained(classifier, path)
    assert result.head_reset  # the encoder has no head: the classifier keeps its new one
    for name, value in task.model.state_dict().items():
        assert torch.equal(classifier.state_dict()[name], value), name
    # Average pooling normalises after pooling: MAE's fine-tuning rule drops the encoder's final norm and starts
    # fc_norm fresh; said in the result's notes (and the log), every other key still checked.
    avg = create_model(P16, num_classes=10, global_pool="avg", **TINY)
    result = load_pretrained(avg, path)
    assert any("norm.* is dropped and fc_norm starts fresh" in note for note in result.notes)
    assert torch.equal(avg.fc_norm.weight, torch.ones(avg.embed_dim)) and torch.equal(avg.fc_norm.bias,
                                                                                      torch.zeros(avg.embed_dim))
    assert torch.equal(avg.blocks[0].attn.qkv.weight, task.model.blocks[0].attn.qkv.weight)
    task.model.pos_embed.data = task.model.pos_embed.data[:, :-1]  # any other mismatch is still an error
    torch.save({"state_dict": task.state_dict(), "vit": task.checkpoint_meta()}, path)
    with pytest.raises(UserValueError, match="pos_embed"):
        load_pretrained(avg, path)


def test_average_pooling_encoders_normalise_in_fc_norm():
    task = tiny_mae(**AT16, model_kwargs={"global_pool": "avg"})
    assert isinstance(task.model.norm, torch.nn.Identity)
    with torch.no_grad():
        task.model.fc_norm.weight.fill_(2.0)
    latent, _ = encode_visible(task.model, torch.randn(2, 1, 16, 16), 4)
    assert latent.std(dim=-1).mean().item() == pytest.approx(2.0, rel=0.05)  # normalised, then scaled by 2


def test_a_mask_ratio_that_leaves_nothing_to_see_or_predict_is_refused():
    with pytest.raises(UserValueError, match="mask_ratio"):
        tiny_mae(**AT16, mask_ratio=0.99)
    with pytest.raises(UserValueError, match="mask_ratio"):
        tiny_mae(**AT16, mask_ratio=0.0)


@pytest.mark.parametrize("layout", [dict(reg_tokens=2, no_embed_class=True), dict(class_token=False,
                                                                                  global_pool="avg")])
def test_encode_visible_asks_the_model_for_its_token_layout(layout):
    """Registers after the cls token (positions on the patches only), or no prefix at all: with every patch kept
    (in a random order) the encoder's tokens are its own forward's, the prefix first; the decoder takes them."""
    torch.manual_seed(0)
    encoder = create_model(P16, **TINY, **layout).eval()
    images = torch.randn(2, 1, 16, 16)
    p, N = encoder.num_prefix_tokens, encoder.patch_embed.num_patches
    latent, masking = encode_visible(encoder, images, N)
    full = encoder.forward_features(images)
    full = encoder.fc_norm(full)  # an average-pooling encoder normalises in fc_norm
    assert latent.shape == (2, p + N, encoder.embed_dim)
    torch.testing.assert_close(latent[:, :p], full[:, :p], atol=1e-5, rtol=0)
    torch.testing.assert_close(take_tokens(full[:, p:], masking.keep), latent[:, p:], atol=1e-5, rtol=0)
    decoder = MAEDecoder(embed_dim=encoder.embed_dim, grid_size=(4, 4), patch_size=(4, 4), in_chans=1,
                         decoder_dim=16, decoder_depth=1, decoder_heads=2)
    assert decoder(latent[:, :p + 5], masking.restore, num_prefix_tokens=p).shape == (2, N, 16)
