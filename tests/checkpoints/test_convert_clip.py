"""OpenCLIP's text names -> ours: the projection transposed, the positional embedding kept under its own name."""

import torch

from vit.checkpoints.convert_clip import open_clip_text, text_config


def test_open_clip_text_names():
    sd = {"token_embedding.weight": torch.zeros(10, 8), "positional_embedding": torch.zeros(5, 8),
          "text_projection": torch.arange(24.0).reshape(8, 3), "ln_final.weight": torch.ones(8),
          "transformer.resblocks.0.attn.in_proj_weight": torch.zeros(24, 8),
          "transformer.resblocks.0.mlp.c_fc.weight": torch.zeros(32, 8), "visual.proj": torch.zeros(4, 3)}
    out = open_clip_text(sd)
    assert set(out) == {"token_embedding.weight", "positional_embedding", "proj.weight", "norm.weight",
                        "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc1.weight"}
    assert torch.equal(out["proj.weight"], sd["text_projection"].T)
    cfg = text_config(out, causal=True, pool="eot")
    assert (cfg.vocab_size, cfg.context_length, cfg.embed_dim, cfg.output_dim, cfg.mlp_ratio) == (10, 5, 8, 3, 4.0)
