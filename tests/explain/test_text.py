"""The translation model's attention with labelled axes: token pieces, capture modes, scores, figures."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import tiny_translator
from vit.data.tokenizers import SPECIAL_TOKENS, BPETokenizer, CharTokenizer, WordTokenizer
from vit.explain.text import (
    alignment_accuracy,
    alignment_text,
    figure_to_array,
    plot_alignment,
    plot_heads,
    plot_top_sources,
    translation_attention,
)

TEXTS = ["the cat sat", "a dog ran far", "the dog sat"]


@pytest.mark.parametrize("kind", ["word", "char", "bpe"])
def test_every_tokenizer_names_each_ids_piece(kind):
    if kind == "bpe":
        tok = BPETokenizer.fit(TEXTS * 20, vocab_size=40)
    else:
        tok = (WordTokenizer if kind == "word" else CharTokenizer).fit(TEXTS)
    ids = tok.encode("the dog ran")
    pieces = tok.pieces(ids)
    assert len(pieces) == len(ids) and all(pieces)
    joined = {"word": " ".join(pieces), "char": "".join(pieces), "bpe": "".join(pieces).replace("▁", " ").strip()}
    assert joined[kind] == "the dog ran"
    assert tok.pieces(range(4)) == list(SPECIAL_TOKENS)  # special ids are named, never dropped




def test_decoded_steps_match_teacher_forcing_on_the_decoded_output():
    translator = tiny_translator(num_decoder_layers=3)
    translator.model.train()  # as a Translator mid-fit: the explanation must hand it back in this mode
    greedy = translation_attention(translator, "3 1 4 1 5", max_len=6)
    assert greedy.mode == "greedy" and greedy.source == ["3", "1", "4", "1", "5"]
    assert greedy.cross.shape == (3, 4, len(greedy.target), 5) and greedy.encoder.shape == (2, 4, 5, 5)
    assert greedy.target_inputs[0] == "<bos>" and greedy.target_inputs[1:] == greedy.target[:-1]
    words = [p for p in greedy.target if p != "<eos>"]
    forced = translation_attention(translator, "3 1 4 1 5", target=" ".join(words))
    assert forced.target[: len(greedy.target)] == greedy.target
    T = len(greedy.target)
    for kind in ("encoder", "cross"):
        got, want = forced.weights(kind)[..., :T, :], greedy.weights(kind)[..., :T, :]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(forced.decoder[..., :T, :T], greedy.decoder, atol=1e-5, rtol=0)
    beam = translation_attention(translator, "3 1 4 1 5", beam_size=3, max_len=6)
    assert beam.mode == "beam 3" and beam.cross.shape[2] == len(beam.target)
    assert translator.model.training, "the model goes back to the mode it came in"
    json.dumps(forced.to_dict())  # plain lists


def test_alignment_accuracy_counts_argmax_hits_per_head_and_for_the_mean():
    cross = torch.zeros(1, 1, 2, 3, 3)  # (L, B, H, T, S): head 0 mirrors, head 1 always picks source 0
    for t in range(3):
        cross[0, 0, 0, t, 2 - t] = 0.9
        cross[0, 0, 1, t, 0] = 0.6
    expected = torch.tensor([[2, 1, 0]])
    per_head, mean = alignment_accuracy(cross, expected)
    assert per_head.tolist() == [[1.0, pytest.approx(1 / 3)]]
    # The mean map: row 0 (0.3 at 0, 0.45 at 2) -> 2 hit; row 1 (0.3, 0.45 at 1) -> hit; row 2 (0.75 at 0) -> hit
    assert mean.tolist() == [1.0]
    per_head, _ = alignment_accuracy(cross, expected, valid=torch.tensor([[True, False, False]]))
    assert per_head.tolist() == [[1.0, 0.0]]


def test_alignment_text_and_figures_are_labelled_with_tokens():
    translator = tiny_translator(num_decoder_layers=3)
    att = translation_attention(translator, "7 2 9", target="9 2 7")
    lines = alignment_text(att, layer=0, head=1, k=2).splitlines()
    assert len(lines) == 4 and lines[0].startswith("9 <- ") and lines[-1].startswith("<eos> <- ")
    fig = plot_alignment(att, layer=-1, head="mean")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["7", "2", "9"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["9", "2", "7", "<eos>"]
    grid = plot_heads(att, "decoder")
    assert len(grid.axes) == 3 * 5  # 3 layers x (4 heads + mean)
    assert [t.get_text() for t in grid.axes[-5].get_xticklabels()] == ["<bos>", "9", "2", "7"]
    top = plot_top_sources(att, k=2)
    texts = [t.get_text() for t in top.axes[0].texts]
    assert "<eos>" in texts and sum(t.split(" ")[0] in {"7", "2", "9"} for t in texts) >= 8
    for f in (fig, grid, top):
        assert figure_to_array(f).shape[-1] == 4
    with pytest.raises(ValueError, match="kind must be one of"):
        att.select("self")
    with pytest.raises(ValueError, match="head must be 'mean'"):
        att.select("cross", head=4)
