"""Translator: a LightningModule that trains and evaluates the text Transformer.

The tokenizers built by the data module travel in the hyperparameters, so a checkpoint
alone can translate: ``vit translate --ckpt best.ckpt "4 1 7"``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import SacreBLEUScore

from vit.data.text import BOS_ID, EOS_ID, Tokenizer, tokenizer_from_dict
from vit.nn.text import PAD_ID, Seq2SeqTransformer

log = logging.getLogger(__name__)

DECODING = ("greedy", "beam")


def inverse_sqrt_schedule(warmup_steps: int):
    """The paper's schedule as a multiplier of the peak LR: linear warm-up, then 1/√step."""
    warmup = max(1, warmup_steps)

    def factor(step: int) -> float:
        step = step + 1  # LambdaLR counts from 0
        return min(step / warmup, (warmup / step) ** 0.5)

    return factor


class Translator(L.LightningModule):
    """Sequence-to-sequence training: label-smoothed cross-entropy, AdamW, inverse-√ warm-up.

    Validation and test report teacher-forced loss and token accuracy, and, on decoded
    output (greedy or beam), exact-match sequence accuracy and SacreBLEU.
    """

    def __init__(
        self,
        tokenizers: dict[str, Any] | None = None,
        *,
        d_model: int = 512,
        num_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        mlp_ratio: float = 4.0,
        dropout: float = 0.1,
        attn_dropout: float = 0.0,
        norm_first: bool = True,
        learned_positions: bool = False,
        max_positions: int = 512,
        share_embeddings: bool = False,
        label_smoothing: float = 0.1,
        lr: float | None = None,
        warmup_steps: int = 4000,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.98),
        lr_schedule: str = "inverse_sqrt",
        decoding: str = "greedy",
        beam_size: int = 4,
        length_penalty: float = 0.6,
        max_decode_length: int | None = None,
    ) -> None:
        super().__init__()
        if tokenizers is None or not {"source", "target"} <= set(tokenizers):
            raise ValueError(
                "Translator needs tokenizers={'source': ..., 'target': ...} built from the training "
                "split; `vit fit` links them from the data module (TranslationDataModule.tokenizers)"
            )
        if decoding not in DECODING:
            raise ValueError(f"model.decoding must be one of {DECODING}, got {decoding!r}")
        if lr_schedule not in ("inverse_sqrt", "constant"):
            raise ValueError(f"model.lr_schedule must be 'inverse_sqrt' or 'constant', got {lr_schedule!r}")
        if share_embeddings and tokenizers["source"] != tokenizers["target"]:
            raise ValueError("model.share_embeddings needs one vocabulary: set data.share_vocab")
        self.save_hyperparameters()
        self.source_tokenizer: Tokenizer = tokenizer_from_dict(tokenizers["source"])
        self.target_tokenizer: Tokenizer = tokenizer_from_dict(tokenizers["target"])
        self.model = Seq2SeqTransformer(
            src_vocab_size=self.source_tokenizer.vocab_size,
            tgt_vocab_size=self.target_tokenizer.vocab_size,
            d_model=d_model,
            num_heads=num_heads,
            num_encoder_layers=num_encoder_layers,
            num_decoder_layers=num_decoder_layers,
            mlp_ratio=mlp_ratio,
            drop=dropout,
            attn_drop=attn_dropout,
            norm_first=norm_first,
            learned_positions=learned_positions,
            max_positions=max_positions,
            share_embeddings=share_embeddings,
        )
        vocab = self.target_tokenizer.vocab_size
        self.metrics = torch.nn.ModuleDict({
            stage: torch.nn.ModuleDict({
                "token_acc": MulticlassAccuracy(vocab, average="micro", ignore_index=PAD_ID),
                "exact_match": MeanMetric(),
                "bleu": SacreBLEUScore(),
            })
            for stage in ("val", "test")
        })

    # ---- forward and decoding ----------------------------------------------------------------
    def forward(self, src: Tensor, tgt_in: Tensor, src_padding_mask: Tensor | None = None) -> Tensor:
        """Teacher-forced logits (B, T, vocab)."""
        return self.model(src, tgt_in, src_padding_mask)

    def generate(
        self,
        src: Tensor,
        *,
        beam_size: int | None = None,
        length_penalty: float | None = None,
        max_len: int | None = None,
    ) -> Tensor:
        """Decode source ids (B, S) to target ids (B, L); beam_size 1 (or greedy config) is greedy."""
        hp = self.hparams
        if beam_size is None:
            beam_size = hp.beam_size if hp.decoding == "beam" else 1
        max_len = hp.max_decode_length if max_len is None else max_len
        if beam_size == 1:
            return self.model.greedy_decode(src, bos_id=BOS_ID, eos_id=EOS_ID, max_len=max_len)
        return self.model.beam_search(
            src, bos_id=BOS_ID, eos_id=EOS_ID, beam_size=beam_size, max_len=max_len,
            length_penalty=hp.length_penalty if length_penalty is None else length_penalty,
        )

    @torch.no_grad()
    def translate(self, sentences: Sequence[str], *, batch_size: int = 64, **decoding: Any) -> list[str]:
        """Translate raw sentences; ``decoding`` goes to ``generate`` (beam_size, length_penalty, max_len)."""
        was_training = self.training
        self.eval()
        encoded = [self.source_tokenizer.encode(s) for s in sentences]
        out = [""] * len(sentences)  # an empty line stays empty
        order = sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: len(encoded[i]))
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            src = torch.full((len(rows), max(len(encoded[i]) for i in rows)), PAD_ID, dtype=torch.long)
            for r, i in enumerate(rows):
                src[r, : len(encoded[i])] = torch.tensor(encoded[i])
            for i, ids in zip(rows, self.generate(src.to(self.device), **decoding).tolist()):
                out[i] = self.target_tokenizer.decode(ids)
        self.train(was_training)
        return out

    # ---- training and evaluation -------------------------------------------------------------
    def _loss(self, logits: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(
            logits.flatten(0, 1).float(), target.flatten(), ignore_index=PAD_ID,
            label_smoothing=self.hparams.label_smoothing,
        )

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        logits = self(batch["src"], batch["tgt_in"], batch["src_padding_mask"])
        loss = self._loss(logits, batch["tgt_out"])
        if not torch.isfinite(loss):
            raise FloatingPointError(f"training loss is {loss.item()} at step {self.global_step}")
        self.log("train_loss", loss, prog_bar=True, batch_size=batch["src"].shape[0])
        return loss

    def _evaluate(self, batch: dict[str, Any], stage: str) -> None:
        B = batch["src"].shape[0]
        logits = self(batch["src"], batch["tgt_in"], batch["src_padding_mask"])
        self.log(f"{stage}_loss", self._loss(logits, batch["tgt_out"]), batch_size=B, sync_dist=True)
        metrics = self.metrics[stage]
        metrics["token_acc"].update(logits.argmax(-1), batch["tgt_out"])

        hyps = [self.target_tokenizer.decode(ids) for ids in self.generate(batch["src"]).tolist()]
        refs = [self.target_tokenizer.normalize(t) for t in batch["target_text"]]
        metrics["exact_match"].update(torch.tensor([h == r for h, r in zip(hyps, refs)], dtype=torch.float))
        metrics["bleu"].update(hyps, [[r] for r in refs])
        for name, metric in metrics.items():
            self.log(f"{stage}_{name}", metric, prog_bar=name == "exact_match", batch_size=B)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[str]:
        return [self.target_tokenizer.decode(ids) for ids in self.generate(batch["src"]).tolist()]

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        # No weight decay on biases, LayerNorms or position tables (the usual AdamW practice).
        decay = [p for n, p in self.model.named_parameters() if p.dim() > 1 and not n.endswith(".pos")]
        rest = [p for n, p in self.model.named_parameters() if not (p.dim() > 1 and not n.endswith(".pos"))]
        peak = hp.lr if hp.lr is not None else hp.d_model**-0.5 * max(1, hp.warmup_steps) ** -0.5
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": rest, "weight_decay": 0.0}],
            lr=peak, betas=tuple(hp.betas), eps=1e-9,
        )
        if hp.lr_schedule == "constant":
            return {"optimizer": optimizer}
        scheduler = LambdaLR(optimizer, inverse_sqrt_schedule(hp.warmup_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


# ---- `vit translate` --------------------------------------------------------------------------
def load_translator(ckpt: str | Path, map_location: str = "cpu") -> Translator:
    """A Translator from a checkpoint written by `vit fit` (the tokenizers are inside)."""
    path = Path(ckpt)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} not found")
    hparams = torch.load(path, map_location="cpu", weights_only=True).get("hyper_parameters", {})
    if "tokenizers" not in hparams:
        raise ValueError(f"{path} is not a Translator checkpoint: its hyperparameters hold no tokenizers")
    return Translator.load_from_checkpoint(path, map_location=map_location, weights_only=True)


def translate_command(argv: list[str]) -> None:
    """`vit translate --ckpt best.ckpt "a sentence" ...` or `--file lines.txt`: print translations."""
    parser = argparse.ArgumentParser(prog="vit translate", description=translate_command.__doc__)
    parser.add_argument("sentences", nargs="*", help="sentences to translate")
    parser.add_argument("--ckpt", required=True, help="checkpoint written by `vit fit` with a Translator")
    parser.add_argument("--file", help="translate every line of this UTF-8 file ('-' reads stdin)")
    parser.add_argument("--beam-size", type=int, default=None, help="1 = greedy (default: as trained)")
    parser.add_argument("--length-penalty", type=float, default=None, help="beam search length penalty")
    parser.add_argument("--max-length", type=int, default=None, help="most tokens to generate")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)

    sentences = list(args.sentences)
    if args.file == "-":
        sentences += sys.stdin.read().splitlines()
    elif args.file:
        path = Path(args.file)
        if not path.is_file():
            parser.error(f"--file {args.file!r} not found")
        sentences += path.read_text(encoding="utf-8").splitlines()
    if not sentences:
        parser.error("give sentences to translate, or --file")

    translator = load_translator(args.ckpt)
    decoding = dict(beam_size=args.beam_size, length_penalty=args.length_penalty, max_len=args.max_length)
    from tqdm import tqdm

    chunks = range(0, len(sentences), args.batch_size)
    for start in tqdm(chunks, desc="translating", file=sys.stderr, disable=len(chunks) < 2):
        batch = sentences[start : start + args.batch_size]
        for line in translator.translate(batch, batch_size=args.batch_size, **decoding):
            print(line)


__all__ = ["Translator", "inverse_sqrt_schedule", "load_translator", "translate_command"]
