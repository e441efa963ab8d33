"""Translator: a LightningModule that trains and evaluates the text Transformer.

The tokenizers built by the data module travel in the hyperparameters, so a checkpoint
alone can translate: ``vit translate --ckpt logs/translate_reverse/checkpoints/last.ckpt "4 1 7"``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import SacreBLEUScore

from vit.data.tokenizers import BOS_ID, EOS_ID, PAD_ID, Tokenizer, tokenizer_from_dict
from vit.errors import UserValueError
from vit.nn.roles import ParamRoles
from vit.nn.text import Seq2SeqTransformer, TextConfig
from vit.tasks.base import BaseTask
from vit.tasks.optim import adamw, param_groups, step_schedule, warmup_cosine
from vit.tasks.text_metrics import CharF

log = logging.getLogger(__name__)

DECODING = ("greedy", "beam")
SCHEDULES = ("inverse_sqrt", "cosine", "constant")


def inverse_sqrt_schedule(warmup_steps: int):
    """The paper's schedule as a multiplier of the peak LR: linear warm-up, then 1/√step."""
    warmup = max(1, warmup_steps)

    def factor(step: int) -> float:
        step = step + 1  # LambdaLR counts from 0
        return min(step / warmup, (warmup / step) ** 0.5)

    return factor


class Translator(BaseTask):
    """Sequence-to-sequence training: label-smoothed cross-entropy, AdamW, inverse-√ warm-up.

    Validation and test report teacher-forced loss and token accuracy, and, on decoded
    output (greedy or beam), exact-match sequence accuracy, SacreBLEU (on words, or on characters for a
    character tokenizer: ``Tokenizer.bleu_tokenize``) and chrF (character 6-grams: it moves on every tokenizer).

    Args:
        tokenizers: {"source": ..., "target": ...} as saved dicts (linked from the data module).
        label_smoothing: label smoothing of the cross-entropy.
        lr: peak learning rate; None = the paper's embed_dim^-0.5 * warmup_steps^-0.5.
        warmup_steps: linear warm-up steps of the schedule.
        weight_decay: AdamW decoupled weight decay (not on biases, norms, positions).
        betas: AdamW betas.
        lr_schedule: "inverse_sqrt" (the paper's), "cosine" (linear warm-up, then cosine down to 0 at the end of
            the run) or "constant".
        decoding: how validation and test decode: "greedy" or "beam".
        beam_size: beams for "beam" decoding.
        length_penalty: beam search length penalty (Wu et al., 2016).
        max_decode_length: most tokens to generate (default: 2 x source length + 10).
        model_kwargs: the fields of the model's `TextConfig` (embed_dim, num_heads, ...), given flat.
    """

    task = "translate"  # its checkpoint["vit"] holds only this: the tokenizers travel in the hyperparameters

    def __init__(
        self,
        tokenizers: dict[str, Any] | None = None,
        *,
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
        **model_kwargs: Any,
    ) -> None:
        if tokenizers is None or not {"source", "target"} <= set(tokenizers):
            raise UserValueError(
                "Translator needs tokenizers={'source': ..., 'target': ...} built from the training "
                "split; `vit fit` links them from the data module (TranslationDataModule.tokenizers)"
            )
        if decoding not in DECODING:
            raise UserValueError(f"model.decoding must be one of {DECODING}, got {decoding!r}")
        if lr_schedule not in SCHEDULES:
            raise UserValueError(f"model.lr_schedule must be one of {', '.join(SCHEDULES)}, got {lr_schedule!r}")
        if model_kwargs.get("share_embeddings") and tokenizers["source"] != tokenizers["target"]:
            raise UserValueError("model.share_embeddings needs one vocabulary: set data.share_vocab")
        # Read by configure_models; jsonargparse follows the attribute there, so `vit fit --help` lists the
        # Seq2SeqTransformer's arguments and a config may set them.
        self.model_kwargs = model_kwargs
        super().__init__()  # saves the arguments; configure_models (tokenizers, then the model), configure_metrics

    def configure_models(self) -> None:
        """The tokenizers, and the Seq2SeqTransformer sized by their vocabularies."""
        self.source_tokenizer: Tokenizer = tokenizer_from_dict(self.hparams.tokenizers["source"])
        self.target_tokenizer: Tokenizer = tokenizer_from_dict(self.hparams.tokenizers["target"])
        self.model = Seq2SeqTransformer(TextConfig(
            src_vocab_size=self.source_tokenizer.vocab_size, tgt_vocab_size=self.target_tokenizer.vocab_size,
            pad_id=PAD_ID, **self.model_kwargs,
        ))

    def configure_metrics(self) -> None:
        """One MetricCollection per stage: teacher-forced token accuracy, decoded exact match, SacreBLEU and chrF."""
        metrics = MetricCollection({
            "token_acc": MulticlassAccuracy(self.target_tokenizer.vocab_size, average="micro", ignore_index=PAD_ID),
            "exact_match": MeanMetric(),
            "bleu": SacreBLEUScore(tokenize=self.target_tokenizer.bleu_tokenize),
            "chrf": CharF(),  # sacrebleu's chrF (not torchmetrics', see vit.tasks.text_metrics)
        })
        self.val_metrics = metrics.clone(prefix="val_")
        self.test_metrics = metrics.clone(prefix="test_")

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
        limit = self.model.src_embed.max_positions
        for number, ids in enumerate(encoded, start=1):
            if len(ids) > limit:  # one long line must not cost every other line its translation
                log.warning("sentence %d has %d tokens, over the model's %d positions: its first %d are translated",
                            number, len(ids), limit, limit)
                del ids[limit:]
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

    @staticmethod
    def unpack(batch: dict[str, Any]) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor]:
        """((source ids, shifted target ids, source padding mask), target ids) of a `TranslationDataModule` batch."""
        return (batch["src"], batch["tgt_in"], batch["src_padding_mask"]), batch["tgt_out"]

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        inputs, target = self.unpack(batch)
        loss = self._loss(self(*inputs), target)
        self.check_loss(loss)
        self.log("train_loss", loss, prog_bar=True, batch_size=target.shape[0])
        return loss

    def _evaluate(self, batch: dict[str, Any], stage: str) -> None:
        inputs, target = self.unpack(batch)
        B = target.shape[0]
        logits = self(*inputs)
        self.log(f"{stage}_loss", self._loss(logits, target), batch_size=B, sync_dist=True)
        metrics = self.val_metrics if stage == "val" else self.test_metrics
        metrics["token_acc"].update(logits.argmax(-1), target)

        hyps = [self.target_tokenizer.decode(ids) for ids in self.generate(batch["src"]).tolist()]
        refs = [self.target_tokenizer.normalize(t) for t in batch["target_text"]]
        metrics["exact_match"].update(torch.tensor([h == r for h, r in zip(hyps, refs)], dtype=torch.float))
        metrics["bleu"].update(hyps, [[r] for r in refs])
        metrics["chrf"].update(hyps, refs)
        self.log_dict(metrics, batch_size=B)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[str]:
        return [self.target_tokenizer.decode(ids) for ids in self.generate(batch["src"]).tolist()]

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        peak = hp.lr if hp.lr is not None else self.model.embed_dim**-0.5 * max(1, hp.warmup_steps) ** -0.5
        groups = param_groups(self.model, peak, hp.weight_decay, roles=text_roles(self.model))
        optimizer = adamw(groups, lr=peak, betas=tuple(hp.betas), eps=1e-9)
        if hp.lr_schedule == "constant":
            return {"optimizer": optimizer}
        if hp.lr_schedule == "cosine":
            warmup, total = self.schedule_steps(0.0, hp.warmup_steps)
            return step_schedule(optimizer, lambda step: warmup_cosine(step, warmup, total, 0.0))
        return step_schedule(optimizer, inverse_sqrt_schedule(hp.warmup_steps))


def text_roles(model: nn.Module) -> ParamRoles:
    """The text Transformer's parameters AdamW must not decay besides biases and norms: its position tables
    (``*.pos``). Here until `vit.nn.text` says it itself, as the ViT does (``param_roles``)."""
    return ParamRoles(no_decay=tuple(n for n, _ in model.named_parameters() if n.endswith(".pos")))


__all__ = ["Translator", "inverse_sqrt_schedule", "text_roles"]
