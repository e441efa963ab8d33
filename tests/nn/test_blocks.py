"""The blocks: their attention weights by argument, against torch.nn.MultiheadAttention, and built from a config
(the ViT's block against timm's `Block` with the same options)."""

from functools import partial

import pytest
import torch
from timm.layers import QuickGELU as TimmQuickGELU
from timm.models.vision_transformer import Block as TimmBlock
from torch import nn

from vit.nn.blocks import DecoderBlock, EncoderBlock, PostNormDecoderBlock, PostNormEncoderBlock, QuickGELU
from vit.nn.configs import TextConfig, ViTConfig

DIM, HEADS = 32, 4


def torch_mha(attn) -> nn.MultiheadAttention:
    """torch's attention with our self- or cross-attention's weights (rows [q; k; v] in both)."""
    ref = nn.MultiheadAttention(DIM, HEADS, batch_first=True).eval()
    with torch.no_grad():
        in_proj = (attn.qkv.weight, attn.qkv.bias) if hasattr(attn, "qkv") else (
            torch.cat([attn.q.weight, attn.kv.weight]), torch.cat([attn.q.bias, attn.kv.bias]))
        ref.in_proj_weight.copy_(in_proj[0])
        ref.in_proj_bias.copy_(in_proj[1])
        ref.out_proj.load_state_dict(attn.proj.state_dict())
    return ref


def perturbed(block: nn.Module) -> nn.Module:
    """Random biases and norms, so that a swapped norm or a missing bias shows."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in block.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5) if "norm" in name and name.endswith("weight") else p.normal_(0, 0.3)
    return block.eval()


@pytest.mark.parametrize("block_class", [EncoderBlock, PostNormEncoderBlock])
@pytest.mark.parametrize("num_queries", [None, 1])
def test_block_returns_its_attention_weights_beside_its_output(block_class, num_queries):
    block = perturbed(block_class(DIM, HEADS, mlp_ratio=2.0))
    x = torch.randn(2, 6, DIM)
    n = 6 if num_queries is None else num_queries
    h = block.norm1(x) if block_class is EncoderBlock else x  # what the attention reads: pre- or post-norm
    with torch.no_grad():
        _, expected = torch_mha(block.attn)(h[:, :n], h, h, average_attn_weights=False)  # (B, H, n, N)
        out, weights = block(x, num_queries=num_queries, return_attention=True)
        fused = block(x, num_queries=num_queries)  # no weights asked: SDPA, the same tokens
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=1e-5)
    assert out.shape == (2, n, DIM)
    torch.testing.assert_close(out, fused, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_class", [DecoderBlock, PostNormDecoderBlock])
def test_decoder_block_returns_its_causal_and_its_cross_attention_weights(block_class):
    block = perturbed(block_class(DIM, HEADS, mlp_ratio=2.0))
    x, memory = torch.randn(2, 5, DIM), torch.randn(2, 7, DIM)
    memory_padding = torch.arange(7)[None] >= torch.tensor([[7], [4]])  # the second source is 4 tokens long
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    pre_norm = block_class is DecoderBlock
    with torch.no_grad():
        h = block.norm1(x) if pre_norm else x
        attended, self_expected = torch_mha(block.attn)(h, h, h, attn_mask=causal, average_attn_weights=False)
        x1 = x + attended if pre_norm else block.norm1(x + attended)
        h = block.cross_norm(x1) if pre_norm else x1
        _, cross_expected = torch_mha(block.cross_attn)(h, memory, memory, key_padding_mask=memory_padding,
                                                        average_attn_weights=False)
        out, self_weights, cross_weights = block(x, memory, memory_padding_mask=memory_padding,
                                                 return_attention=True)
        fused = block(x, memory, memory_padding_mask=memory_padding)
    torch.testing.assert_close(self_weights, self_expected, atol=1e-6, rtol=1e-5)  # (B, H, T, T), causal
    torch.testing.assert_close(cross_weights, cross_expected, atol=1e-6, rtol=1e-5)  # (B, H, T, S)
    torch.testing.assert_close(out, fused, atol=1e-5, rtol=1e-5)


def test_block_from_a_vit_config_is_timms_block_with_those_options():
    config = ViTConfig(embed_dim=DIM, num_heads=HEADS, mlp_ratio=3.0, qkv_bias=False, act_layer="quick_gelu",
                       norm_eps=1e-5, init_values=0.1, drop_rate=0.1, attn_drop_rate=0.2)
    ours = EncoderBlock.from_config(config, drop_path_rate=0.3)
    theirs = TimmBlock(DIM, HEADS, mlp_ratio=3.0, qkv_bias=False, init_values=0.1, proj_drop=0.1, attn_drop=0.2,
                       drop_path=0.3, act_layer=TimmQuickGELU, norm_layer=partial(nn.LayerNorm, eps=1e-5))
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    assert isinstance(ours.mlp.act, QuickGELU) and ours.norm1.eps == ours.norm2.eps == 1e-5
    assert (ours.attn.attn_drop.p, ours.attn.proj_drop.p, ours.mlp.drop1.p) == (0.2, 0.1, 0.1)
    assert ours.drop_path1.p == ours.drop_path2.p == 0.3 and ours.attn.learned_scale is None
    perturbed(theirs)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 6, DIM)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x), theirs(x), atol=1e-5, rtol=1e-5)
    assert EncoderBlock.from_config(config.replace(locality_attention=True)).attn.learned_scale.shape == (HEADS,)


def test_blocks_from_a_text_config_are_the_papers():
    config = TextConfig(src_vocab_size=11, tgt_vocab_size=13, embed_dim=DIM, num_heads=HEADS, mlp_ratio=2.0,
                        drop_rate=0.2, activation="relu")
    for block in (EncoderBlock.from_config(config), DecoderBlock.from_config(config)):
        assert isinstance(block.mlp.act, nn.ReLU) and block.mlp.fc1.out_features == 2 * DIM
        assert block.norm1.eps == 1e-5 and block.attn.qkv.bias is not None and block.attn.learned_scale is None
        assert isinstance(block.ls1, nn.Identity) and block.drop_path1.p == 0.0 and block.attn.proj_drop.p == 0.2
    assert type(DecoderBlock.from_config(config)) is DecoderBlock
    assert isinstance(PostNormDecoderBlock.from_config(config).cross_attn.kv, nn.Linear)
