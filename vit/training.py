"""What `vit fit` adds to Lightning's Trainer: a last.ckpt that is rewritten every epoch."""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint


class LastCheckpoint(ModelCheckpoint):
    """Rewrites ``last.ckpt`` after every epoch (or every ``every_n_train_steps``), whatever the metrics say.

    This is what ``--ckpt_path last`` resumes from. Lightning's own ``save_last`` (2.6) only saves
    when a top-k checkpoint is saved at the same step, so an epoch without a better metric would
    leave nothing to resume from.

    Args:
        dirpath: the checkpoint folder (None: the logger's run folder, as for ModelCheckpoint).
        every_n_train_steps: also rewrite it every this many optimiser steps (mid-epoch resume).
    """

    def __init__(self, dirpath: str | None = None, every_n_train_steps: int | None = None) -> None:
        super().__init__(
            dirpath=dirpath, filename=self.CHECKPOINT_NAME_LAST, monitor=None, save_top_k=1,
            enable_version_counter=False, every_n_train_steps=every_n_train_steps or None,
        )
