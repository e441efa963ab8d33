"""The text model's config, in the ViT's style: plain values in and out, the model built from it or from keywords,
and a trained translator's checkpoint (which stores the keywords) still loading."""

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers import TINY_DIM
from vit.nn.blocks import PostNormDecoderBlock, PostNormEncoderBlock
from vit.nn.configs import TextConfig
from vit.nn.text import Seq2SeqTransformer

FIXTURE = Path(__file__).resolve().parents[1] / "explain" / "translate_reverse.fp16.pt"
VALUES = dict(  # every field, by hand: what a checkpoint stores
    src_vocab_size=23, tgt_vocab_size=29, embed_dim=TINY_DIM, num_heads=4, num_encoder_layers=2, num_decoder_layers=1,
    mlp_ratio=2.0, drop_rate=0.0, attn_drop_rate=0.1, activation="gelu", norm_eps=1e-6, norm_first=False,
    learned_positions=True, max_positions=64, share_embeddings=False, pad_id=3,
)


def test_text_config_round_trips_through_plain_values():
    config = TextConfig(**VALUES)
    assert config.to_dict() == VALUES
    assert TextConfig.from_dict(config.to_dict()) == config
    assert config.replace(num_heads=8).num_heads == 8 and config.replace() is config
    with pytest.raises(ValueError, match=r"unknown model option\(s\) d_model; accepted: .*embed_dim"):
        TextConfig.from_dict({**VALUES, "d_model": 32})
    assert TextConfig(src_vocab_size=5, tgt_vocab_size=5).to_dict() == {  # the defaults: the paper's base model
        "src_vocab_size": 5, "tgt_vocab_size": 5, "embed_dim": 512, "num_heads": 8, "num_encoder_layers": 6,
        "num_decoder_layers": 6, "mlp_ratio": 4.0, "drop_rate": 0.1, "attn_drop_rate": 0.0, "activation": "relu",
        "norm_eps": 1e-5, "norm_first": True, "learned_positions": False, "max_positions": 512,
        "share_embeddings": False, "pad_id": 0,
    }


def test_text_config_refuses_bad_values_naming_them():
    with pytest.raises(ValueError, match=r"activation must be one of \['gelu', 'relu'\], got 'swish'"):
        TextConfig(**{**VALUES, "activation": "swish"})
    with pytest.raises(ValueError, match=r"share_embeddings needs one vocabulary.*source size 23 and target size 29"):
        TextConfig(**{**VALUES, "share_embeddings": True})


def test_the_text_model_is_built_from_its_config_or_the_same_keywords():
    config = TextConfig(**VALUES)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(config)
    torch.manual_seed(0)
    from_keywords = Seq2SeqTransformer(**VALUES)
    assert model.config == from_keywords.config == config
    theirs = from_keywords.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in model.state_dict().items())
    # what the config says, in the modules
    assert len(model.encoder) == 2 and len(model.decoder) == 1 and isinstance(model.src_embed.pos, nn.Parameter)
    assert all(type(b) is PostNormEncoderBlock for b in model.encoder)
    assert type(model.decoder[0]) is PostNormDecoderBlock
    assert isinstance(model.encoder[0].mlp.act, nn.GELU) and model.encoder[0].attn.attn_drop.p == 0.1
    assert model.tgt_embed.token.weight[3].eq(0).all() and model.head.weight.shape == (29, 32)
    # keywords over a config replace its fields; the model rebuilt from its config's values takes its weights
    assert len(Seq2SeqTransformer(config, num_decoder_layers=3).decoder) == 3
    rebuilt = Seq2SeqTransformer(TextConfig.from_dict(model.config.to_dict()))
    rebuilt.load_state_dict(model.state_dict())


def test_a_trained_translators_checkpoint_still_loads_and_translates():
    """The checkpoint stores the model's keywords in its hyperparameters (no config): they build the TextConfig."""
    from vit.tasks import Translator, load_task

    translator = load_task(FIXTURE, Translator)
    assert translator.model.config.embed_dim == 64 and translator.model.config.num_encoder_layers == 2
    assert translator.translate(["4 1 7 19 3 12 8 0 15"]) == ["15 0 8 12 3 19 7 1 4"]
