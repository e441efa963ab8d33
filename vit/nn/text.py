"""The text encoder-decoder Transformer ("Attention Is All You Need", Vaswani et al. 2017).

It runs on the same blocks and the same attention kernel as the ViT:

source ids (B, S) -> TokenEmbedding (×√d + positions)   (B, S, C)
                  -> EncoderBlock × N, padding mask      (B, S, C)  = memory
target ids (B, T) -> TokenEmbedding                      (B, T, C)
                  -> DecoderBlock × N: causal self-attention, cross-attention over memory
                  -> Linear tied to the target embedding (B, T, vocab)

Decoding (greedy and beam search) keeps a KV cache per attention layer, so each new
token costs one position of work instead of the whole prefix.

Attention weights come from the kernel's explicit path when asked for (``return_attention=True``
on ``encode``, ``decode``, ``greedy_decode``, ``beam_search``; ``forward_attention`` with teacher
forcing), as a ``TextAttention``. Not asking leaves every computation on the fused path, as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from vit.nn.attention import KVCache
from vit.nn.blocks import DecoderBlock, EncoderBlock, PostNormDecoderBlock, PostNormEncoderBlock
from vit.nn.configs import TextConfig


def sinusoidal_positions(num_positions: int, dim: int) -> Tensor:
    """The paper's fixed encoding: sin on even channels, cos on odd ones, (positions, dim)."""
    if dim % 2:
        raise ValueError(f"sinusoidal positions need an even embed_dim, got {dim}")
    position = torch.arange(num_positions, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


class TokenEmbedding(nn.Module):
    """Token embedding scaled by √dim, plus sinusoidal or learned positions, then dropout."""

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        *,
        max_positions: int = 512,
        learned_positions: bool = False,
        drop_rate: float = 0.0,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.max_positions = max_positions
        self.token = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        # Unit-variance after the √dim scale; the tied output layer then gives logits of moderate size.
        nn.init.normal_(self.token.weight, std=embed_dim**-0.5)
        with torch.no_grad():
            self.token.weight[pad_id].zero_()
        if learned_positions:
            self.pos = nn.Parameter(torch.zeros(max_positions, embed_dim))
            nn.init.trunc_normal_(self.pos, std=0.02)
        else:
            self.register_buffer("pos", sinusoidal_positions(max_positions, embed_dim), persistent=False)
        self.drop = nn.Dropout(drop_rate)

    def forward(self, ids: Tensor, start: int = 0, padding_mask: Tensor | None = None) -> Tensor:
        """Embed ids (B, L) at positions start .. start+L-1; returns (B, L, embed_dim).

        With ``padding_mask`` (B, L), True at padding, positions count real tokens only, so a
        left-padded row gets the same positions, and the same outputs, as a right-padded one.
        """
        end = start + ids.shape[1]
        if end > self.max_positions:
            raise ValueError(
                f"sequence reaches position {end}, beyond max_positions={self.max_positions}; "
                "raise max_positions or shorten the input"
            )
        if padding_mask is None:
            pos = self.pos[start:end]  # (L, C), broadcast over the batch
        else:
            index = (~padding_mask).long().cumsum(dim=1).sub(1).clamp(min=0) + start  # (B, L)
            pos = self.pos[index]  # (B, L, C)
        return self.drop(self.token(ids) * math.sqrt(self.embed_dim) + pos)


@dataclass
class DecoderState:
    """What incremental decoding carries between steps: the encoder output and the caches."""

    memory: Tensor  # (B, S, C)
    memory_padding_mask: Tensor | None  # (B, S), True = padding
    self_caches: list[KVCache] = field(default_factory=list)
    cross_caches: list[KVCache] = field(default_factory=list)
    length: int = 0  # target positions already decoded
    encoder_attention: Tensor | None = None  # (L, B, H, S, S) when asked for; beam search does not reorder it

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search follows the surviving beams)."""
        self.memory = self.memory.index_select(0, index)
        if self.memory_padding_mask is not None:
            self.memory_padding_mask = self.memory_padding_mask.index_select(0, index)
        for cache in self.self_caches + self.cross_caches:
            cache.reorder(index)


@dataclass
class TextAttention:
    """Every layer's attention weights for one pass, each stacked over layers.

    Row t of ``decoder`` and ``cross`` is the query at target input position t (BOS first), the one
    that predicts output token t. ``decoder`` is causal: zero above the diagonal.
    """

    encoder: Tensor  # (L_enc, B, H, S, S) source self-attention
    decoder: Tensor  # (L_dec, B, H, T, T) target causal self-attention
    cross: Tensor  # (L_dec, B, H, T, S) target -> source


class _StepAttention:
    """Each decoding step's attention rows, kept per batch row so beam search can reorder them."""

    def __init__(self) -> None:
        self.self_rows: list[Tensor] = []  # step t: (L, B, H, 1, t + 1)
        self.cross_rows: list[Tensor] = []  # step t: (L, B, H, 1, S)

    def add(self, self_rows: Tensor, cross_rows: Tensor) -> None:
        self.self_rows.append(self_rows)
        self.cross_rows.append(cross_rows)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index``: a beam inherits its parent's history."""
        self.self_rows = [w.index_select(1, index) for w in self.self_rows]
        self.cross_rows = [w.index_select(1, index) for w in self.cross_rows]

    def stack(self, encoder: Tensor, index: Tensor | None = None) -> TextAttention:
        """One TextAttention over all steps; step t's self-attention row is zero-padded to T keys."""
        T = len(self.self_rows)
        pad = lambda w: torch.nn.functional.pad(w, (0, T - w.shape[-1]))
        decoder = torch.cat([pad(w) for w in self.self_rows], dim=3)  # (L, B, H, T, T)
        cross = torch.cat(self.cross_rows, dim=3)  # (L, B, H, T, S)
        if index is not None:
            decoder, cross = decoder.index_select(1, index), cross.index_select(1, index)
        return TextAttention(encoder, decoder, cross)


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer for sequence-to-sequence tasks such as translation.

    Built from one `TextConfig` (``config=``, or its fields as keywords: ``Seq2SeqTransformer(src_vocab_size=...,
    tgt_vocab_size=..., embed_dim=...)``), as the ViT from its `ViTConfig`.
    """

    def __init__(self, config: TextConfig | None = None, **options: Any) -> None:
        super().__init__()
        c = self.config = TextConfig(**options) if config is None else config.replace(**options)
        self.embed_dim, self.pad_id, self.norm_first = c.embed_dim, c.pad_id, c.norm_first
        embed = dict(max_positions=c.max_positions, learned_positions=c.learned_positions, drop_rate=c.drop_rate,
                     pad_id=c.pad_id)
        self.src_embed = TokenEmbedding(c.src_vocab_size, c.embed_dim, **embed)
        self.tgt_embed = TokenEmbedding(c.tgt_vocab_size, c.embed_dim, **embed)
        if c.share_embeddings:
            self.src_embed.token = self.tgt_embed.token

        encoder_block = EncoderBlock if c.norm_first else PostNormEncoderBlock
        decoder_block = DecoderBlock if c.norm_first else PostNormDecoderBlock
        self.encoder = nn.ModuleList(encoder_block.from_config(c) for _ in range(c.num_encoder_layers))
        self.decoder = nn.ModuleList(decoder_block.from_config(c) for _ in range(c.num_decoder_layers))
        # Pre-norm leaves the residual stream unnormalised: close each stack with a LayerNorm.
        self.encoder_norm = nn.LayerNorm(c.embed_dim, eps=c.norm_eps) if c.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.embed_dim, eps=c.norm_eps) if c.norm_first else nn.Identity()

        self.head = nn.Linear(c.embed_dim, c.tgt_vocab_size, bias=False)
        self._init_weights()
        self.head.weight = self.tgt_embed.token.weight  # tied, as in the paper

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)

    # ---- the two stacks -------------------------------------------------------------------
    def encode(
        self, src: Tensor, src_padding_mask: Tensor | None = None, *, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Source ids (B, S) -> memory (B, S, C). Padded positions are masked as keys.

        ``return_attention`` also returns every layer's self-attention, (L, B, H, S, S).
        """
        x = self.src_embed(src, padding_mask=src_padding_mask)
        weights = []
        for block in self.encoder:
            x = block(x, key_padding_mask=src_padding_mask, return_attention=return_attention)
            if return_attention:
                x, w = x
                weights.append(w)
        memory = self.encoder_norm(x)
        return (memory, torch.stack(weights)) if return_attention else memory

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        memory_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
        *,
        state: DecoderState | None = None,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor, Tensor]:
        """Target ids (B, T) -> logits (B, T, vocab), each position seeing only earlier ones.

        Right padding needs no mask (causality already hides it); left padding needs
        ``tgt_padding_mask`` (B, T). With ``state``, ``tgt`` holds only the newest positions and
        the caches supply the rest. ``return_attention`` also returns every layer's causal
        self-attention (L, B, H, T, T') and cross-attention (L, B, H, T, S); T' counts cached keys.
        """
        start = 0 if state is None else state.length
        x = self.tgt_embed(tgt, start=start, padding_mask=tgt_padding_mask)
        self_weights, cross_weights = [], []
        for i, block in enumerate(self.decoder):
            x = block(
                x,
                memory,
                memory_padding_mask=memory_padding_mask,
                padding_mask=tgt_padding_mask,
                self_cache=None if state is None else state.self_caches[i],
                cross_cache=None if state is None else state.cross_caches[i],
                return_attention=return_attention,
            )
            if return_attention:
                x, self_w, cross_w = x
                self_weights.append(self_w)
                cross_weights.append(cross_w)
        if state is not None:
            state.length += tgt.shape[1]
        logits = self.head(self.decoder_norm(x))
        if return_attention:
            return logits, torch.stack(self_weights), torch.stack(cross_weights)
        return logits

    def forward(
        self, src: Tensor, tgt: Tensor, src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Teacher-forced logits (B, T, vocab) for target inputs ``tgt`` (B, T) given ``src`` (B, S)."""
        if src_padding_mask is None:
            src_padding_mask = src.eq(self.pad_id)
        memory = self.encode(src, src_padding_mask)
        return self.decode(tgt, memory, src_padding_mask, tgt_padding_mask)

    def forward_attention(
        self, src: Tensor, tgt: Tensor, src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> tuple[Tensor, TextAttention]:
        """Teacher-forced logits (B, T, vocab) and every layer's attention weights."""
        if src_padding_mask is None:
            src_padding_mask = src.eq(self.pad_id)
        memory, encoder = self.encode(src, src_padding_mask, return_attention=True)
        logits, decoder, cross = self.decode(tgt, memory, src_padding_mask, tgt_padding_mask, return_attention=True)
        return logits, TextAttention(encoder, decoder, cross)

    # ---- decoding ---------------------------------------------------------------------------
    def start_decoding(
        self, src: Tensor, src_padding_mask: Tensor | None = None, *, return_attention: bool = False
    ) -> DecoderState:
        """Encode the source once and set up empty caches; ``return_attention`` keeps the encoder's weights."""
        if src_padding_mask is None:
            src_padding_mask = src.eq(self.pad_id)
        memory = self.encode(src, src_padding_mask, return_attention=return_attention)
        memory, encoder = memory if return_attention else (memory, None)
        n = len(self.decoder)
        return DecoderState(
            memory, src_padding_mask, [KVCache() for _ in range(n)], [KVCache() for _ in range(n)],
            encoder_attention=encoder,
        )

    def _next_logits(
        self, tokens: Tensor, state: DecoderState, use_cache: bool, steps: _StepAttention | None = None
    ) -> Tensor:
        """Logits (B, vocab) for the position after ``tokens`` (B, t); ``steps`` keeps that position's weights."""
        capture = steps is not None
        if use_cache:
            new = tokens[:, state.length :]  # only what the cache has not seen yet
            out = self.decode(new, state.memory, state.memory_padding_mask, state=state, return_attention=capture)
        else:
            # Without a cache the whole prefix goes through the decoder again at every step.
            out = self.decode(tokens, state.memory, state.memory_padding_mask, return_attention=capture)
        if not capture:
            return out[:, -1]
        logits, self_w, cross_w = out
        steps.add(self_w[..., -1:, :], cross_w[..., -1:, :])  # the newest query's rows
        return logits[:, -1]

    def _max_steps(self, src: Tensor, max_len: int | None) -> int:
        steps = 2 * src.shape[1] + 10 if max_len is None else max_len
        return min(steps, self.tgt_embed.max_positions - 1)

    @torch.no_grad()
    def greedy_decode(
        self,
        src: Tensor,
        *,
        bos_id: int,
        eos_id: int,
        max_len: int | None = None,
        use_cache: bool = True,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, TextAttention]:
        """Pick the most likely token at each step. Returns (B, L) ids without BOS.

        A finished row ends with EOS and is padded with ``pad_id``; decoding stops when every row
        has produced EOS or after ``max_len`` tokens (default: 2 × source length + 10).
        ``return_attention`` also returns each step's weights as a TextAttention (T = L steps).
        """
        steps = _StepAttention() if return_attention else None
        state = self.start_decoding(src, return_attention=return_attention)
        B = src.shape[0]
        tokens = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
        finished = torch.zeros(B, dtype=torch.bool, device=src.device)
        for _ in range(self._max_steps(src, max_len)):
            logits = self._next_logits(tokens, state, use_cache, steps)
            next_token = logits.argmax(dim=-1).masked_fill(finished, self.pad_id)
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            finished |= next_token.eq(eos_id)
            if finished.all():
                break
        return (tokens[:, 1:], steps.stack(state.encoder_attention)) if return_attention else tokens[:, 1:]

    @torch.no_grad()
    def beam_search(
        self,
        src: Tensor,
        *,
        bos_id: int,
        eos_id: int,
        beam_size: int = 4,
        length_penalty: float = 0.6,
        max_len: int | None = None,
        use_cache: bool = True,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, TextAttention]:
        """Keep the ``beam_size`` best prefixes per sentence; return the best (B, L) ids without BOS.

        Finished beams stay in the beam with a frozen score. The winner maximises
        log-probability / ((5 + length) / 6) ** length_penalty (Wu et al., 2016); 0 disables it.
        ``return_attention`` also returns the winner's weights at each step, along its own history.
        """
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        B, K, device = src.shape[0], beam_size, src.device
        steps = _StepAttention() if return_attention else None
        state = self.start_decoding(src, return_attention=return_attention)
        state.reorder(torch.arange(B, device=device).repeat_interleave(K))  # (B*K, ...)
        tokens = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
        # Only the first beam is live at the start, so the K copies do not pick the same tokens.
        scores = torch.full((B, K), float("-inf"), device=device)
        scores[:, 0] = 0.0
        finished = torch.zeros(B * K, dtype=torch.bool, device=device)
        lengths = torch.zeros(B * K, device=device)  # generated tokens up to and including EOS

        for _ in range(self._max_steps(src, max_len)):
            logp = self._next_logits(tokens, state, use_cache, steps).float().log_softmax(dim=-1)  # (B*K, V)
            V = logp.shape[-1]
            # A finished beam has one continuation, PAD, at no cost: its score stays frozen.
            frozen = torch.full_like(logp, float("-inf"))
            frozen[:, self.pad_id] = 0.0
            logp = torch.where(finished[:, None], frozen, logp)
            candidates = scores[:, :, None] + logp.view(B, K, V)  # (B, K, V)
            scores, flat = candidates.view(B, K * V).topk(K, dim=-1)  # (B, K)
            beam, next_token = flat // V, flat % V
            rows = (torch.arange(B, device=device)[:, None] * K + beam).view(-1)  # (B*K,)

            state.reorder(rows)
            if steps is not None:
                steps.reorder(rows)  # a beam's history is its parent's, as its tokens are
            finished, lengths = finished[rows], lengths[rows]
            next_token = next_token.view(-1)
            tokens = torch.cat([tokens[rows], next_token[:, None]], dim=1)
            lengths = lengths + (~finished).float()
            finished = finished | next_token.eq(eos_id)
            if finished.all():
                break

        penalty = ((5.0 + lengths.view(B, K)) / 6.0) ** length_penalty
        best = (scores / penalty).argmax(dim=-1)  # (B,)
        rows = torch.arange(B, device=device) * K + best
        return (tokens[rows, 1:], steps.stack(state.encoder_attention, rows)) if return_attention else tokens[rows, 1:]


__all__ = [
    "DecoderState", "Seq2SeqTransformer", "TextAttention", "TextConfig", "TokenEmbedding", "sinusoidal_positions",
]
