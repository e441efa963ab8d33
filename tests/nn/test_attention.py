"""The attention kernel against torch.nn.MultiheadAttention, across both paths and all masks."""

import pytest
import torch
from torch import nn

from vit.nn.attention import KVCache, MultiHeadAttention, causal_mask, locality_scale
from vit.nn.rope import Rotary

B, LQ, LK, DIM, HEADS = 3, 5, 7, 32, 4


def ours_from_torch(ref: nn.MultiheadAttention, cross: bool) -> MultiHeadAttention:
    """Our module with the reference's weights copied in (in_proj rows are [q; k; v])."""
    ours = MultiHeadAttention(DIM, HEADS, cross=cross)
    with torch.no_grad():
        if cross:
            ours.q.weight.copy_(ref.in_proj_weight[:DIM])
            ours.q.bias.copy_(ref.in_proj_bias[:DIM])
            ours.kv.weight.copy_(ref.in_proj_weight[DIM:])
            ours.kv.bias.copy_(ref.in_proj_bias[DIM:])
        else:
            ours.qkv.weight.copy_(ref.in_proj_weight)
            ours.qkv.bias.copy_(ref.in_proj_bias)
        ours.proj.weight.copy_(ref.out_proj.weight)
        ours.proj.bias.copy_(ref.out_proj.bias)
    return ours.eval()


def reference() -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(DIM, HEADS, batch_first=True).eval()
    with torch.no_grad():  # non-zero biases so a bias mix-up cannot hide
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    return ref


def padding_mask(lengths: list[int], total: int) -> torch.Tensor:
    return torch.arange(total)[None, :] >= torch.tensor(lengths)[:, None]  # True = pad


MASKS = {
    "none": lambda lq, lk: {},
    "key_padding": lambda lq, lk: {"key_padding_mask": padding_mask([lk, lk - 2, 3], lk)},
    "bool_attn": lambda lq, lk: {"attn_mask": torch.rand(lq, lk) > 0.7},
    "float_attn": lambda lq, lk: {"attn_mask": torch.randn(lq, lk)},
    "both": lambda lq, lk: {
        "attn_mask": torch.randn(lq, lk),
        "key_padding_mask": padding_mask([lk, 4, 2], lk),
    },
}


def no_empty_rows(masks: dict) -> dict:
    """nn.MultiheadAttention returns NaN for fully masked rows; keep one key always visible."""
    if "attn_mask" in masks and masks["attn_mask"].dtype == torch.bool:
        masks["attn_mask"][:, 0] = False
    return masks


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("return_attention", [False, True])
@pytest.mark.parametrize("fused_attn", [True, False])  # False: the explicit path without the weights (CPU bf16)
def test_self_attention_matches_torch(mask, return_attention, fused_attn):
    torch.manual_seed(0)
    ref = reference()
    ours = ours_from_torch(ref, cross=False)
    ours.fused_attn = fused_attn
    x = torch.randn(B, LK, DIM)
    masks = no_empty_rows(MASKS[mask](LK, LK))
    expected, expected_w = ref(x, x, x, average_attn_weights=False, **masks)
    got = ours(x, return_attention=return_attention, **masks)
    if return_attention:
        got, weights = got
        torch.testing.assert_close(weights, expected_w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("return_attention", [False, True])
def test_cross_attention_matches_torch(mask, return_attention):
    torch.manual_seed(1)
    ref = reference()
    ours = ours_from_torch(ref, cross=True)
    x, context = torch.randn(B, LQ, DIM), torch.randn(B, LK, DIM)
    masks = no_empty_rows(MASKS[mask](LQ, LK))
    expected, _ = ref(x, context, context, **masks)
    got = ours(x, context, return_attention=return_attention, **masks)
    got = got[0] if return_attention else got
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_causal_matches_torch():
    torch.manual_seed(2)
    ref = reference()
    ours = ours_from_torch(ref, cross=False)
    x = torch.randn(B, LK, DIM)
    mask = nn.Transformer.generate_square_subsequent_mask(LK)
    expected, _ = ref(x, x, x, attn_mask=mask)
    for return_attention, fused_attn in ((False, True), (True, True), (False, False)):
        ours.fused_attn = fused_attn
        got = ours(x, is_causal=True, return_attention=return_attention)
        got = got[0] if return_attention else got
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    ours.fused_attn = True
    # causal combined with padding takes the explicit-mask branch of the fast path
    pad = padding_mask([LK, LK, 5], LK)
    expected, _ = ref(x, x, x, attn_mask=mask, key_padding_mask=pad)
    torch.testing.assert_close(ours(x, is_causal=True, key_padding_mask=pad), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("causal", [False, True])
def test_fast_and_explicit_paths_agree(mask, causal):
    torch.manual_seed(3)
    attn = MultiHeadAttention(DIM, HEADS).eval()
    x = torch.randn(B, LK, DIM)
    masks = MASKS[mask](LK, LK)
    fast = attn(x, is_causal=causal, **masks)
    explicit, weights = attn(x, is_causal=causal, return_attention=True, **masks)
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)
    assert weights.shape == (B, HEADS, LK, LK)
    row_sums = weights.sum(-1)
    assert torch.all(((row_sums - 1).abs() < 1e-5) | (row_sums == 0))


def test_fully_masked_query_gives_zeros_not_nan():
    torch.manual_seed(4)
    attn = MultiHeadAttention(DIM, HEADS).eval()
    x = torch.randn(2, 4, DIM)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[1] = True  # query 1 may see nothing
    fast = attn(x, attn_mask=mask)
    explicit, weights = attn(x, attn_mask=mask, return_attention=True)
    for out in (fast, explicit):
        assert not out.isnan().any()
        # an empty attention contributes nothing: only the output projection's bias is left
        torch.testing.assert_close(out[:, 1], attn.proj.bias.expand(2, DIM))
    assert (weights[:, :, 1] == 0).all()
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)
    # all keys padded for one sequence, through the float-mask route as well
    pad = torch.tensor([[False] * 4, [True] * 4])
    out = attn(x, key_padding_mask=pad, attn_mask=torch.zeros(4, 4))
    assert not out.isnan().any()
    out.sum().backward()
    assert all(not p.grad.isnan().any() for p in attn.parameters())


@pytest.mark.parametrize("return_attention", [False, True])
def test_gradcheck_float64(return_attention):
    torch.manual_seed(5)
    attn = MultiHeadAttention(8, 2).double().eval()
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    context = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    pad = torch.tensor([[False, False, False], [False, False, True]])

    def self_attn(x):
        out = attn(x, key_padding_mask=pad, is_causal=True, return_attention=return_attention)
        return out[0] if return_attention else out

    assert torch.autograd.gradcheck(self_attn, (x,))
    cross = MultiHeadAttention(8, 2, cross=True).double().eval()

    def cross_attn(x, context):
        out = cross(x, context, return_attention=return_attention)
        return out[0] if return_attention else out

    assert torch.autograd.gradcheck(cross_attn, (x, context))


def test_kv_cache_decoding_matches_full_causal_pass():
    torch.manual_seed(6)
    self_attn = MultiHeadAttention(DIM, HEADS).eval()
    cross_attn = MultiHeadAttention(DIM, HEADS, cross=True).eval()
    x, memory = torch.randn(B, 6, DIM), torch.randn(B, LK, DIM)
    full = self_attn(x, is_causal=True)
    full_cross = cross_attn(x, memory)
    self_cache, cross_cache = KVCache(), KVCache()
    steps, cross_steps = [], []
    for t in range(6):
        steps.append(self_attn(x[:, t : t + 1], is_causal=True, cache=self_cache))
        cross_steps.append(cross_attn(x[:, t : t + 1], memory, cache=cross_cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(cross_steps, 1), full_cross, atol=1e-5, rtol=1e-5)
    assert self_cache.k.shape == (B, HEADS, 6, DIM // HEADS)
    self_cache.reorder(torch.tensor([2, 0]))
    assert self_cache.k.shape[0] == 2


def test_causal_mask_aligns_to_last_key():
    assert causal_mask(1, 4).tolist() == [[False] * 4]
    assert causal_mask(2, 3).tolist() == [[False, False, True], [False, False, False]]


def test_bad_shapes_are_clear_errors():
    attn = MultiHeadAttention(DIM, HEADS)
    x = torch.randn(2, 5, DIM)
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        attn(x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="divisible by num_heads"):
        MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match="context"):
        MultiHeadAttention(DIM, HEADS, cross=True)(x)


# ---- the steps of the forward pass, one at a time ---------------------------------------------------
def rotate_as_complex(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Channels c and c + D/2 as one complex number, turned by e^(i·angle): (..., L, D), angles (L, D/2)."""
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones_like(angles), angles)
    return torch.cat([z.real, z.imag], dim=-1)


@pytest.mark.parametrize("num_queries", [None, 2])
@pytest.mark.parametrize("return_attention", [False, True])
def test_rotary_positions_turn_queries_and_keys_before_the_kernel(num_queries, return_attention):
    torch.manual_seed(7)
    attn = MultiHeadAttention(DIM, HEADS).double().eval()
    D, L = DIM // HEADS, 6
    angles = torch.rand(L, D // 2, dtype=torch.float64) * 6.3
    angles[0] = 0  # a prefix token, which the rotation leaves alone
    rope = Rotary(torch.cat([angles.sin()] * 2, -1), torch.cat([angles.cos()] * 2, -1))
    x = torch.randn(2, L, DIM, dtype=torch.float64)
    n = L if num_queries is None else num_queries
    q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).view(2, L, 3, HEADS, D).permute(2, 0, 3, 1, 4)
    q, k = rotate_as_complex(q[:, :, :n], angles[:n]), rotate_as_complex(k, angles)  # the queries: first n tokens
    weights = (q @ k.transpose(-2, -1) / D**0.5).softmax(-1)  # (B, H, n, L)
    expected = (weights @ v).transpose(1, 2).reshape(2, n, DIM) @ attn.proj.weight.T + attn.proj.bias
    queries, context = (x, None) if num_queries is None else (x[:, :n], x)
    got = attn(queries, context, rope=rope, return_attention=return_attention)
    if return_attention:
        got, got_weights = got
        torch.testing.assert_close(got_weights, weights)
    torch.testing.assert_close(got, expected)


def test_locality_scale_multiplies_each_heads_queries_by_its_own_scale():
    q = torch.randn(2, 3, 5, 4)  # (B, H, Lq, D)
    scale = torch.tensor([0.5, 2.0, -1.0])
    expected = torch.stack([q[:, h] * scale[h] for h in range(3)], dim=1)
    torch.testing.assert_close(locality_scale(q, scale), expected)
    # an autocast bf16 q stays bf16 against the fp32 parameter
    assert locality_scale(q.bfloat16(), scale).dtype == torch.bfloat16


def test_locality_attention_refuses_a_cache_before_touching_it():
    attn = MultiHeadAttention(DIM, HEADS, locality_attention=True)
    cache = KVCache()
    with pytest.raises(ValueError, match="KV cache breaks"):
        attn(torch.randn(1, 3, DIM), cache=cache)
    assert cache.k is None and cache.v is None


def test_causal_goes_to_sdpa_as_its_flag_only_over_a_plain_square(monkeypatch):
    """The flag lets SDPA pick its flash kernels; any other mask goes in as an additive mask (and no flag)."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kwargs):
        calls.append((is_causal, attn_mask))
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    attn = MultiHeadAttention(DIM, HEADS).eval()
    x = torch.randn(B, LK, DIM)
    attn(x, is_causal=True)
    assert calls.pop() == (True, None)
    attn(x, is_causal=True, key_padding_mask=padding_mask([LK, 5, 3], LK))
    flag, mask = calls.pop()
    assert not flag and mask.shape == (B, 1, LK, LK)
    torch.testing.assert_close(mask[0, 0], torch.zeros(LK, LK).masked_fill(causal_mask(LK, LK), float("-inf")))
    attn(x[:, -2:], x, is_causal=True)  # the last 2 queries over all keys (as with a KV cache): not a square
    flag, mask = calls.pop()
    assert not flag and torch.equal(torch.isneginf(mask), causal_mask(2, LK))
    attn(x)
    assert calls.pop() == (False, None)
