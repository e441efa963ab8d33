"""The text Transformer: masks, reference layers, positions, cached and beam decoding."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers import TINY_DIM
from vit.data.tokenizers import BOS_ID as BOS
from vit.data.tokenizers import EOS_ID as EOS
from vit.data.tokenizers import PAD_ID
from vit.nn.attention import MultiHeadAttention
from vit.nn.blocks import DecoderBlock, EncoderBlock, PostNormDecoderBlock, PostNormEncoderBlock
from vit.nn.text import Seq2SeqTransformer, sinusoidal_positions
from vit.nn.vision import VisionTransformer


def tiny_model(**overrides) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    kwargs = dict(
        src_vocab_size=23, tgt_vocab_size=29, embed_dim=TINY_DIM, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, mlp_ratio=2.0, drop_rate=0.0, max_positions=64,
    )
    kwargs.update(overrides)
    return Seq2SeqTransformer(**kwargs).eval()


def padded_batch() -> torch.Tensor:
    # Three sources of lengths 7, 4 and 1, right-padded with PAD_ID.
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 23, (3, 7), generator=g)
    src[1, 4:] = PAD_ID
    src[2, 1:] = PAD_ID
    return src


def test_every_attention_layer_is_the_vit_kernel():
    model = tiny_model()
    vit = VisionTransformer(img_size=8, patch_size=4, in_chans=1, num_classes=2, embed_dim=TINY_DIM, depth=1,
                            num_heads=4)
    attentions = [m for m in model.modules() if isinstance(m, nn.MultiheadAttention | MultiHeadAttention)]
    # Per encoder block one self-attention; per decoder block a self- and a cross-attention.
    assert len(attentions) == 2 + 2 * 2
    assert {type(m) for m in attentions} == {type(vit.blocks[0].attn)} == {MultiHeadAttention}
    assert all(type(b) is EncoderBlock for b in model.encoder)
    assert type(vit.blocks[0]) is EncoderBlock  # the encoder block is literally the ViT's


def test_padded_source_tokens_change_nothing():
    model = tiny_model()
    src = padded_batch()
    mask = src.eq(PAD_ID)
    tgt = torch.randint(4, 29, (3, 5))
    reference = model(src, tgt, mask)
    garbage = src.masked_fill(mask, 17)  # different ids at the padded positions, same mask
    torch.testing.assert_close(model(garbage, tgt, mask), reference, atol=1e-6, rtol=0)
    # ... while a real source token does change the output (the check above can fail).
    changed = src.clone()
    changed[1, 2] = 5 if src[1, 2] != 5 else 6
    assert not torch.allclose(model(changed, tgt, mask)[1], reference[1], atol=1e-4)


def test_future_target_tokens_change_no_earlier_output():
    model = tiny_model()
    src = padded_batch()
    tgt = torch.randint(4, 29, (3, 6))
    reference = model(src, tgt)
    j = 3
    future = tgt.clone()
    future[:, j:] = torch.randint(4, 29, (3, 6 - j))
    out = model(src, future)
    torch.testing.assert_close(out[:, :j], reference[:, :j], atol=1e-6, rtol=0)
    assert not torch.allclose(out[:, j:], reference[:, j:], atol=1e-4)


def copy_encoder_weights(ours: EncoderBlock, ref: nn.TransformerEncoderLayer) -> None:
    with torch.no_grad():
        ours.attn.qkv.weight.copy_(ref.self_attn.in_proj_weight)  # rows [q; k; v] in both
        ours.attn.qkv.bias.copy_(ref.self_attn.in_proj_bias)
        ours.attn.proj.load_state_dict(ref.self_attn.out_proj.state_dict())
        ours.mlp.fc1.load_state_dict(ref.linear1.state_dict())
        ours.mlp.fc2.load_state_dict(ref.linear2.state_dict())
        ours.norm1.load_state_dict(ref.norm1.state_dict())
        ours.norm2.load_state_dict(ref.norm2.state_dict())


@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_block_matches_torch_transformer_encoder_layer(norm_first):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, norm_first=norm_first, batch_first=True)
    block = EncoderBlock if norm_first else PostNormEncoderBlock
    ours = block(64, 4, mlp_ratio=2.0, act_layer=nn.ReLU, norm_eps=1e-5)
    copy_encoder_weights(ours, ref)
    with torch.no_grad():  # LayerNorms that are not the identity, so a swapped norm shows
        for norm in (ref.norm1, ref.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        ours.norm1.load_state_dict(ref.norm1.state_dict())
        ours.norm2.load_state_dict(ref.norm2.state_dict())
    ref.eval(), ours.eval()
    x = torch.randn(3, 7, 64)
    torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=0)

    padding = padded_batch().eq(PAD_ID)
    keep = ~padding  # torch's fast path writes zeros at padded positions: compare the real tokens
    torch.testing.assert_close(
        ours(x, key_padding_mask=padding)[keep], ref(x, src_key_padding_mask=padding)[keep], atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_block_matches_torch_transformer_decoder_layer(norm_first):
    torch.manual_seed(0)
    ref = nn.TransformerDecoderLayer(32, 4, dim_feedforward=64, norm_first=norm_first, batch_first=True).eval()
    block = DecoderBlock if norm_first else PostNormDecoderBlock
    ours = block(32, 4, mlp_ratio=2.0, act_layer=nn.ReLU, norm_eps=1e-5).eval()
    C = 32
    with torch.no_grad():
        for norm in (ref.norm1, ref.norm2, ref.norm3):  # not the identity, so a swapped norm shows
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        ours.attn.qkv.weight.copy_(ref.self_attn.in_proj_weight)
        ours.attn.qkv.bias.copy_(ref.self_attn.in_proj_bias)
        ours.attn.proj.load_state_dict(ref.self_attn.out_proj.state_dict())
        w, b = ref.multihead_attn.in_proj_weight, ref.multihead_attn.in_proj_bias
        ours.cross_attn.q.weight.copy_(w[:C]), ours.cross_attn.q.bias.copy_(b[:C])
        ours.cross_attn.kv.weight.copy_(w[C:]), ours.cross_attn.kv.bias.copy_(b[C:])
        ours.cross_attn.proj.load_state_dict(ref.multihead_attn.out_proj.state_dict())
        ours.mlp.fc1.load_state_dict(ref.linear1.state_dict())
        ours.mlp.fc2.load_state_dict(ref.linear2.state_dict())
        # torch's norm2 sits before the cross-attention, norm3 before the MLP
        for mine, theirs in (("norm1", "norm1"), ("cross_norm", "norm2"), ("norm2", "norm3")):
            getattr(ours, mine).load_state_dict(getattr(ref, theirs).state_dict())
    x, memory = torch.randn(3, 5, C), torch.randn(3, 7, C)
    memory_padding = padded_batch().eq(PAD_ID)
    expected = ref(x, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5), tgt_is_causal=True,
                   memory_key_padding_mask=memory_padding)
    out = ours(x, memory, memory_padding_mask=memory_padding)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_sinusoidal_positions_follow_the_paper():
    table = sinusoidal_positions(50, 16)
    for pos, i in [(0, 0), (3, 1), (17, 5), (49, 7)]:
        angle = pos / 10000 ** (2 * i / 16)
        assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
        assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_embeddings_are_scaled_and_tied():
    model = tiny_model()
    ids = torch.tensor([[5, 6, 7]])
    expected = model.tgt_embed.token(ids) * math.sqrt(32) + sinusoidal_positions(3, 32)
    torch.testing.assert_close(model.tgt_embed(ids), expected)
    assert model.head.weight is model.tgt_embed.token.weight
    assert model.src_embed.token is not model.tgt_embed.token

    shared = tiny_model(src_vocab_size=29, share_embeddings=True)
    assert shared.src_embed.token.weight is shared.tgt_embed.token.weight is shared.head.weight
    with pytest.raises(ValueError, match="one vocabulary"):
        tiny_model(share_embeddings=True)  # 23 source vs 29 target ids


def test_learned_positions_and_post_norm_options():
    model = tiny_model(learned_positions=True, norm_first=False)
    assert isinstance(model.tgt_embed.pos, nn.Parameter)
    assert all(type(b) in (PostNormEncoderBlock, PostNormDecoderBlock) for b in [*model.encoder, *model.decoder])
    src, tgt = padded_batch(), torch.randint(4, 29, (3, 5))
    out = model(src, tgt)
    out.sum().backward()
    assert out.shape == (3, 5, 29)
    assert model.tgt_embed.pos.grad is not None and model.tgt_embed.pos.grad[:5].abs().sum() > 0
    with pytest.raises(ValueError, match="max_positions"):
        model(src, torch.randint(4, 29, (3, 65)))


def test_cached_decoding_matches_full_recomputation():
    model = tiny_model()
    src = padded_batch()
    state = model.start_decoding(src)
    tokens = torch.full((3, 1), BOS)
    for _ in range(8):  # step by step with the cache ...
        step_logits = model.decode(tokens[:, -1:], state.memory, state.memory_padding_mask, state=state)
        full_logits = model.decode(tokens, state.memory, state.memory_padding_mask)  # ... and without
        torch.testing.assert_close(step_logits[:, -1], full_logits[:, -1], atol=1e-5, rtol=0)
        tokens = torch.cat([tokens, torch.randint(4, 29, (3, 1))], dim=1)

    kwargs = dict(bos_id=BOS, eos_id=EOS, max_len=12)
    greedy = model.greedy_decode(src, **kwargs)
    assert torch.equal(greedy, model.greedy_decode(src, use_cache=False, **kwargs))
    beam = model.beam_search(src, beam_size=3, **kwargs)
    assert torch.equal(beam, model.beam_search(src, beam_size=3, use_cache=False, **kwargs))


def test_beam_of_one_is_greedy():
    model = tiny_model()
    src = padded_batch()
    for max_len in (1, 5, 20):
        greedy = model.greedy_decode(src, bos_id=BOS, eos_id=EOS, max_len=max_len)
        beam = model.beam_search(src, bos_id=BOS, eos_id=EOS, beam_size=1, max_len=max_len)
        assert torch.equal(beam, greedy)


class LengthScript(Seq2SeqTransformer):
    """Decodes by a script instead of the network: token 4 once per source token, then EOS."""

    def _next_logits(self, tokens, state, use_cache, steps=None):
        generated = tokens.shape[1] - 1
        source_len = (~state.memory_padding_mask).sum(dim=1)  # rows follow the beams' reordering
        logits = torch.full((tokens.shape[0], 29), -5.0)
        logits[:, 4] = 0.0
        logits[:, EOS] = torch.where(generated >= source_len, 5.0, -5.0)
        return logits


class TrapScript(Seq2SeqTransformer):
    """A case where the greedy first step is a trap (probabilities in the comments)."""

    def _next_logits(self, tokens, state, use_cache, steps=None):
        probs = torch.full((tokens.shape[0], 29), 1e-9)
        for row, prefix in enumerate(tokens[:, 1:].tolist()):
            if prefix == []:
                probs[row, 4], probs[row, 5] = 0.6, 0.4  # A, B
            elif prefix == [4]:
                probs[row, 4], probs[row, 5], probs[row, EOS] = 0.36, 0.34, 0.3
            elif prefix == [5]:
                probs[row, EOS], probs[row, 4], probs[row, 5] = 0.9, 0.05, 0.05
            else:
                probs[row, EOS] = 1.0
        return probs.log()


def scripted(cls: type[Seq2SeqTransformer]) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return cls(src_vocab_size=23, tgt_vocab_size=29, embed_dim=16, num_heads=2, num_encoder_layers=1,
               num_decoder_layers=1, max_positions=64).eval()


def test_decoding_stops_at_eos_per_row_and_pads_after_it():
    model = scripted(LengthScript)
    src = padded_batch()  # 7, 4 and 1 real tokens
    expected = torch.tensor([[4] * 7 + [EOS], [4] * 4 + [EOS] + [PAD_ID] * 3, [4, EOS] + [PAD_ID] * 6])
    assert torch.equal(model.greedy_decode(src, bos_id=BOS, eos_id=EOS, max_len=30), expected)
    assert torch.equal(model.beam_search(src, bos_id=BOS, eos_id=EOS, beam_size=3, max_len=30), expected)
    # max_len cuts decoding short when EOS does not come in time.
    assert torch.equal(model.greedy_decode(src, bos_id=BOS, eos_id=EOS, max_len=3), expected[:, :3])


def test_beam_search_escapes_the_greedy_trap_and_applies_the_length_penalty():
    model = scripted(TrapScript)
    src = padded_batch()[:1]
    greedy = model.greedy_decode(src, bos_id=BOS, eos_id=EOS)
    assert greedy.tolist() == [[4, 4, EOS]]  # p = 0.6 * 0.36 = 0.216
    beam = model.beam_search(src, bos_id=BOS, eos_id=EOS, beam_size=2, length_penalty=0.0)
    assert beam.tolist() == [[5, EOS, PAD_ID]]  # p = 0.4 * 0.9 = 0.36
    # A strong length penalty ((5 + len) / 6) ** 4 prefers the longer hypothesis kept in the beam.
    long = model.beam_search(src, bos_id=BOS, eos_id=EOS, beam_size=2, length_penalty=4.0)
    assert long.tolist() == [[4, 4, EOS]]


def test_beam_search_handles_a_batch_like_single_sentences():
    model = tiny_model()
    src = padded_batch()
    kwargs = dict(bos_id=BOS, eos_id=EOS, beam_size=4, length_penalty=0.6, max_len=10)
    batch = model.beam_search(src, **kwargs)
    for i in range(3):
        alone = model.beam_search(src[i : i + 1, : int(src[i].ne(PAD_ID).sum())], **kwargs)[0]
        assert torch.equal(batch[i, : alone.shape[0]], alone) and batch[i, alone.shape[0] :].eq(PAD_ID).all()


def sequence_log_prob(model: Seq2SeqTransformer, src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Log-probability of each decoded row up to and including its EOS."""
    tgt_in = torch.cat([torch.full((out.shape[0], 1), BOS), out[:, :-1]], dim=1)
    logp = model(src, tgt_in).log_softmax(-1).gather(-1, out[..., None])[..., 0]
    return (logp * out.ne(PAD_ID)).sum(dim=1)


def test_wider_beam_finds_more_likely_sequences():
    model = tiny_model()
    src = torch.randint(4, 23, (32, 6))
    kwargs = dict(bos_id=BOS, eos_id=EOS, max_len=8)
    greedy = sequence_log_prob(model, src, model.greedy_decode(src, **kwargs))
    beam = sequence_log_prob(model, src, model.beam_search(src, beam_size=5, length_penalty=0.0, **kwargs))
    assert (beam >= greedy - 1e-4).float().mean() > 0.9  # beam search is a heuristic: "almost always"
    assert beam.mean() > greedy.mean()


def test_left_and_right_padded_batches_give_the_same_outputs():
    """Positions count real tokens and target padding is masked, so padding on either side is the same."""
    model = tiny_model()
    g = torch.Generator().manual_seed(2)
    lengths_src, lengths_tgt = [7, 4, 2], [5, 3, 1]
    sources = [torch.randint(4, 23, (n,), generator=g) for n in lengths_src]
    targets = [torch.randint(4, 29, (n,), generator=g) for n in lengths_tgt]

    def pad(seqs, left):
        width = max(len(s) for s in seqs)
        out = torch.full((len(seqs), width), PAD_ID)
        for i, s in enumerate(seqs):
            if left:
                out[i, width - len(s):] = s
            else:
                out[i, : len(s)] = s
        return out

    outputs = {}
    for left in (False, True):
        src, tgt = pad(sources, left), pad(targets, left)
        logits = model(src, tgt, src.eq(PAD_ID), tgt.eq(PAD_ID))
        outputs[left] = [logits[i, -n:] if left else logits[i, :n] for i, n in enumerate(lengths_tgt)]
    for right_rows, left_rows in zip(outputs[False], outputs[True]):
        torch.testing.assert_close(left_rows, right_rows, atol=1e-5, rtol=0)
    # Without the target mask a left-padded row sees its padding: the check above can fail.
    src, tgt = pad(sources, True), pad(targets, True)
    unmasked = model(src, tgt, src.eq(PAD_ID))[2, -1:]
    assert not torch.allclose(unmasked, outputs[False][2], atol=1e-3)


def test_the_padding_id_is_the_one_given_not_a_data_layer_constant():
    """The model takes its padding id as an argument (nn/ imports nothing from vit.data): with pad_id=5, id 5
    has a zero embedding, is masked as a key (padding changes no real position's memory), and pads decoding."""
    model = tiny_model(pad_id=5)
    assert model.src_embed.token.weight[5].abs().sum() == 0 and model.src_embed.token.weight[0].abs().sum() > 0
    src = torch.randint(6, 23, (1, 4), generator=torch.Generator().manual_seed(2))
    padded = torch.cat([src, torch.full((1, 3), 5)], dim=1)
    with torch.no_grad():
        alone = model.encode(src)
        with_pad = model.encode(padded, padded.eq(5))
        assert torch.allclose(model.start_decoding(padded).memory[:, :4], alone, atol=1e-5)
    assert torch.allclose(with_pad[:, :4], alone, atol=1e-5)
    import vit.nn.text

    assert "vit.data" not in Path(vit.nn.text.__file__).read_text()


# ---- attention capture ------------------------------------------------------------------------
def torch_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    """torch's own MultiheadAttention holding our layer's weights (in_proj rows are [q; k; v])."""
    embed_dim = ours.proj.in_features
    ref = nn.MultiheadAttention(embed_dim, ours.num_heads, batch_first=True)
    parts = [ours.q, ours.kv] if ours.cross else [ours.qkv]
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([p.weight for p in parts]))
        ref.in_proj_bias.copy_(torch.cat([p.bias for p in parts]))
        ref.out_proj.weight.copy_(ours.proj.weight)
        ref.out_proj.bias.copy_(ours.proj.bias)
    return ref.eval()


@torch.no_grad()
def reference_attention(model: Seq2SeqTransformer, src: torch.Tensor, tgt: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every layer's weights from torch.nn.MultiheadAttention on the inputs our attention layers see."""
    weights = lambda mha, q, kv, **masks: mha(q, kv, kv, average_attn_weights=False, **masks)[1]
    pad = src.eq(PAD_ID)
    x = model.src_embed(src, padding_mask=pad)
    encoder = []
    for block in model.encoder:
        h = block.norm1(x)
        encoder.append(weights(torch_mha(block.attn), h, h, key_padding_mask=pad))
        x = block(x, key_padding_mask=pad)
    memory = model.encoder_norm(x)
    y = model.tgt_embed(tgt)
    causal = torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool).triu(1)
    decoder, cross = [], []
    for block in model.decoder:
        h = block.norm1(y)
        decoder.append(weights(torch_mha(block.attn), h, h, attn_mask=causal))
        h = block.cross_norm(y + block.attn(h, is_causal=True))  # the cross-attention's input (pre-norm)
        cross.append(weights(torch_mha(block.cross_attn), h, memory, key_padding_mask=pad))
        y = block(y, memory, memory_padding_mask=pad)
    return {"encoder": torch.stack(encoder), "decoder": torch.stack(decoder), "cross": torch.stack(cross)}


def assert_attention_matches(captured, expected: dict[str, torch.Tensor]) -> None:
    for kind, want in expected.items():
        got = getattr(captured, kind)
        assert got.shape == want.shape, kind
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0, msg=lambda m, kind=kind: f"{kind}: {m}")


def test_teacher_forced_attention_matches_torch_multihead_attention():
    model = tiny_model()
    src = padded_batch()
    tgt = torch.randint(4, 29, (3, 6), generator=torch.Generator().manual_seed(2))
    logits, captured = model.forward_attention(src, tgt)
    torch.testing.assert_close(logits, model(src, tgt), atol=1e-5, rtol=0)  # explicit vs fused path
    assert_attention_matches(captured, reference_attention(model, src, tgt))
    assert captured.encoder[:, 1, :, :, 4:].abs().max() == 0  # padded source keys get nothing


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_attention_per_generated_step_matches_torch_multihead_attention(beam_size, use_cache):
    # Each step's rows, along the returned hypothesis's own history, are what teacher forcing on
    # that hypothesis gives: for beam search, a wrongly reordered history would not match.
    model = tiny_model()
    # Padded rows, and enough sentences that some winning beams change slots on the way.
    src = torch.cat([padded_batch(), torch.randint(4, 23, (13, 7), generator=torch.Generator().manual_seed(3))])
    kwargs = dict(bos_id=BOS, eos_id=EOS, max_len=9, use_cache=use_cache, return_attention=True)
    if beam_size == 1:
        ids, captured = model.greedy_decode(src, **kwargs)
    else:
        ids, captured = model.beam_search(src, beam_size=beam_size, **kwargs)
    assert captured.cross.shape == (2, 16, 4, ids.shape[1], src.shape[1])
    inputs = torch.cat([torch.full((16, 1), BOS), ids[:, :-1]], dim=1)  # what each step was fed
    assert_attention_matches(captured, reference_attention(model, src, inputs))


def test_decoding_without_capture_is_unchanged_and_never_asks_for_weights(monkeypatch):
    model = tiny_model()
    src = padded_batch()
    kwargs = dict(bos_id=BOS, eos_id=EOS, max_len=12)
    with_weights = model.greedy_decode(src, return_attention=True, **kwargs)[0]
    beam_with_weights = model.beam_search(src, beam_size=3, return_attention=True, **kwargs)[0]
    asked = []
    forward = MultiHeadAttention.forward

    def spy(self, *args, **kw):
        asked.append(kw.get("return_attention", False))
        return forward(self, *args, **kw)

    monkeypatch.setattr(MultiHeadAttention, "forward", spy)
    greedy = model.greedy_decode(src, **kwargs)
    beam = model.beam_search(src, beam_size=3, **kwargs)
    assert asked and not any(asked), "capture off must stay on the fused path"
    assert torch.equal(greedy, with_weights) and torch.equal(beam, beam_with_weights)
