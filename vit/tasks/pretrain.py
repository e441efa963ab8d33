"""Masked-autoencoder pre-training of a ViT on unlabelled images, as a LightningModule (`vit pretrain`).

The task holds the encoder as ``model`` (a plain `VisionTransformer` without a head, as an ImageClassifier
holds it) and the MAE decoder as ``decoder`` (`vit.nn.mae`). Its checkpoint is therefore one that
``vit fit --model.init_args.pretrained`` and ``vit probe`` read as they read a classifier's: the weights under
``model.`` load with every key checked, and ``decoder.`` is left behind.

At the end of every training epoch (or every ``figure_every_n_epochs``), a fixed batch of validation images
(the first, kept from the first validation, the sanity check included) goes through a fixed masking, and
the figure of originals, masked inputs and reconstructions is written to the run folder
(``reconstructions/epoch_NNNN.png``) and to the TensorBoard or W&B logger.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.errors import UserValueError
from vit.nn.mae import (
    MAEDecoder,
    encode_visible,
    mae_init_,
    normalize_patches,
    num_visible,
    patchify,
    reconstruction_loss,
    sincos_pos_embed,
    unpatchify,
)
from vit.nn.vision import VisionTransformer
from vit.preprocessing import default_normalisation
from vit.tasks.base import VisionTask
from vit.tasks.optim import adamw, merge_groups, param_groups, step_schedule, warmup_cosine

FIGURE_SEED = 0  # the fixed masking of the figure's images, the same every epoch


class MaskedAutoencoder(VisionTask):
    """MAE pre-training (He et al., 2021): a ViT encoder on the visible patches, a light decoder, the loss on
    the masked patches; AdamW with betas (0.9, 0.95), lr = blr x global batch / 256, warm-up then cosine.

    Args:
        model: a name from ``vit.list_models()``: the encoder, the architecture you will fine-tune.
        img_size: input side (linked from the datamodule); ``None`` keeps the named config's.
        in_chans: input channels (linked from the datamodule); ``None`` keeps the named config's.
        model_kwargs: other ``VisionTransformer`` options, e.g. ``{global_pool: avg}``; give the fine-tuning
            recipe the same ones, since they name the weights (``avg`` pooling keeps ``fc_norm``, not ``norm``).
        mean, std: the data's normalisation (linked from the datamodule); for the figure, and in the checkpoint.
        mask_ratio: share of the patches hidden from the encoder in each image (the paper's 0.75).
        decoder_dim, decoder_depth, decoder_heads: the decoder's width, blocks and heads (the paper's 512, 8, 16).
        norm_pix_loss: predict each patch normalised by its own mean and variance (the paper's default).
        fixed_pos_embed: start the encoder's position embedding at 2-D sin-cos and keep it fixed while
            pre-training, as MAE does (fine-tuning trains it); off, it is learnt from timm's initialisation.
        blr: base learning rate, for a global batch of 256.
        lr: an absolute peak learning rate instead of ``blr x global batch / 256``.
        weight_decay: AdamW decoupled weight decay (not on biases, norms, tokens and position embeddings).
        betas: AdamW betas (the paper's 0.9, 0.95).
        warmup_epochs: linear warm-up in epochs (fractions allowed); ``warmup_steps`` overrides it.
        warmup_steps: linear warm-up in optimiser steps.
        min_lr: the floor of the cosine decay.
        figure_images: validation images in the reconstruction figure; 0 = no figure.
        figure_every_n_epochs: draw the figure every this many epochs (each takes about half a second).
    """

    task = "pretrain"

    def __init__(
        self,
        model: str = "vit_base_patch16_224",
        img_size: int | None = None,
        in_chans: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        mask_ratio: float = 0.75,
        decoder_dim: int = 512,
        decoder_depth: int = 8,
        decoder_heads: int = 16,
        norm_pix_loss: bool = True,
        fixed_pos_embed: bool = True,
        blr: float = 1.5e-4,
        lr: float | None = None,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_epochs: float = 40.0,
        warmup_steps: int | None = None,
        min_lr: float = 0.0,
        figure_images: int = 8,
        figure_every_n_epochs: int = 1,
    ) -> None:
        super().__init__()  # saves the arguments, then configure_models
        self.mean, self.std = default_normalisation(self.model.in_chans, mean or None, std or None)
        self.figure_batch: Tensor | None = None

    def configure_models(self) -> None:
        """The encoder (a ViT without a head) and the decoder, both initialised as MAE's; the encoder's position
        embedding fixed at 2-D sin-cos when ``fixed_pos_embed``."""
        hp = self.hparams
        self.model: VisionTransformer = self.create_vit(num_classes=0)
        num_patches = self.model.patch_embed.num_patches
        self.visible = num_visible(num_patches, hp.mask_ratio)
        if not 0 < self.visible < num_patches:
            raise UserValueError(f"mask_ratio {hp.mask_ratio} leaves {self.visible} of {num_patches} patches visible; "
                                 "MAE needs some visible and some masked (the paper's 0.75)")
        self.decoder = MAEDecoder(
            embed_dim=self.model.embed_dim, grid_size=self.model.patch_embed.grid_size,
            patch_size=self.model.patch_size, in_chans=self.model.in_chans, decoder_dim=hp.decoder_dim,
            decoder_depth=hp.decoder_depth, decoder_heads=hp.decoder_heads,
        )
        mae_init_(self.model)
        mae_init_(self.decoder)
        if hp.fixed_pos_embed:
            with torch.no_grad():
                self.model.pos_embed.copy_(sincos_pos_embed(self.model.embed_dim, self.model.patch_embed.grid_size,
                                                            self.model.pos_embed_prefix))
            self.model.pos_embed.requires_grad_(False)

    # --- the method ----------------------------------------------------------------------------
    def forward(self, images: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(loss, predicted patches (B, N, ph*pw*C), mask (B, N), 1 = masked) for a batch of normalised images."""
        latent, masking = encode_visible(self.model, images, self.visible, generator=generator)
        grid = self.model.patch_grid(images.shape[-2], images.shape[-1])
        pred = self.decoder(latent, masking.restore, grid, self.model.num_prefix_tokens)
        target = patchify(images, self.model.patch_size)
        if self.hparams.norm_pix_loss:
            target = normalize_patches(target)[0]
        return reconstruction_loss(pred, target, masking.mask), pred, masking.mask

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        images = self.unpack(batch)[0]  # (images, labels) from an image DataModule: the labels unused
        self.check_images(images)
        loss = self(images)[0]
        self.check_loss(loss)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images = self.unpack(batch)[0]
        # A fixed masking per batch, so val_loss compares epochs with each other (not masks).
        generator = torch.Generator().manual_seed(batch_idx)
        self.log("val_loss", self(images, generator)[0], prog_bar=True, sync_dist=True)
        if batch_idx == 0 and self.figure_batch is None:
            self.figure_batch = images[: self.hparams.figure_images].detach()

    # --- the reconstruction figure --------------------------------------------------------------
    @torch.no_grad()
    def reconstruct(self, images: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Reconstructions (B, C, H, W) of normalised images, visible patches pasted back (MAE's "reconstruction
        + visible"), in the images' normalisation; and the mask (B, N)."""
        _, pred, mask = self(images, generator)
        target = patchify(images, self.model.patch_size)
        if self.hparams.norm_pix_loss:  # the prediction is per-patch normalised: undo it with the true statistics
            _, mean, std = normalize_patches(target)
            pred = pred.float() * std + mean
        mixed = torch.where(mask.bool().unsqueeze(-1), pred.float(), target.float())
        grid = self.model.patch_grid(images.shape[-2], images.shape[-1])
        return unpatchify(mixed, self.model.patch_size, grid), mask

    def on_train_epoch_end(self) -> None:
        every = max(1, self.hparams.figure_every_n_epochs)
        if self.hparams.figure_images <= 0 or (self.current_epoch + 1) % every:
            return
        out_dir = self.trainer.log_dir  # on every rank: Lightning broadcasts it (rank 0 alone would wait forever)
        if out_dir is None or self.figure_batch is None or not self.trainer.is_global_zero:
            return
        from vit.reports import reconstruction_figure, save_figure
        from vit.tasks.mistakes import log_figures

        images = self.figure_batch
        self.eval()  # no dropout or drop path in the picture
        recon, mask = self.reconstruct(images, torch.Generator().manual_seed(FIGURE_SEED))
        self.train()
        fig = reconstruction_figure(images.float().cpu(), recon.cpu(), mask.cpu(), self.model.patch_size,
                                    self.mean, self.std, title=f"epoch {self.current_epoch}: original / masked "
                                    f"({self.hparams.mask_ratio:.0%}) / reconstruction + visible")
        save_figure(fig, Path(out_dir) / "reconstructions" / f"epoch_{self.current_epoch:04d}.png")
        log_figures(self.trainer.loggers, {"reconstruction": fig}, self.global_step, prefix="pretrain")

    # --- optimiser -------------------------------------------------------------------------------
    def peak_lr(self) -> float:
        """``lr``, or ``blr`` x global batch (batch size x devices x nodes x accumulation) / 256."""
        hp = self.hparams
        return hp.lr if hp.lr is not None else self.scaled_lr(hp.blr, 256, "blr", "MAE's base batch")

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        lr = self.peak_lr()
        # The one no-decay rule over both networks (their roles: the encoder's tokens, the decoder's mask token);
        # what does not train (the fixed sin-cos positions) stays out of the optimiser.
        groups = merge_groups(*(param_groups(net, lr, hp.weight_decay) for net in (self.model, self.decoder)))
        groups = [{**g, "params": [p for p in g["params"] if p.requires_grad]} for g in groups]
        optimizer = adamw([g for g in groups if g["params"]], lr=lr, betas=tuple(hp.betas))
        warmup, total = self.schedule_steps(hp.warmup_epochs, hp.warmup_steps)
        min_ratio = self.min_lr_ratio(hp.min_lr, lr)
        return step_schedule(optimizer, lambda step: warmup_cosine(step, warmup, total, min_ratio))

    # --- checkpoint (checked on loading by VisionTask.on_load_checkpoint) -----------------------
    def checkpoint_meta(self) -> dict[str, Any]:
        """What the checkpoint says about itself: the task, and the encoder to build for its weights."""
        hp = self.hparams
        return {"task": self.task, "model_name": self.model_name, "model_config": dict(self.model_config),
                "mean": list(self.mean), "std": list(self.std), "mask_ratio": hp.mask_ratio,
                "decoder": [hp.decoder_dim, hp.decoder_depth, hp.decoder_heads], "norm_pix_loss": hp.norm_pix_loss}
