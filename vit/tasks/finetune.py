"""Fine-tuning strategies: which parts of a pretrained ViT train, epoch by epoch.

    full           everything trains (with layer-wise LR decay, the usual fine-tuning)
    linear_probe   the backbone is frozen; only the head trains
    partial        the patch embedding and the first ``freeze_blocks`` blocks are frozen
    staged         the head alone for ``head_epochs`` epochs, then everything, with its own warm-up

Freezing is a function of the epoch alone, re-applied at every training step: a resumed run freezes
and unfreezes exactly where the uninterrupted run did. A frozen parameter keeps ``requires_grad``
off (no gradient, no update, no weight decay) but stays in its optimiser group, so the groups never
change. Frozen modules also run in eval mode (no dropout or stochastic depth in features that do not
train). Under DDP, parameters that come and go need ``find_unused_parameters``; the task checks it.
"""

from __future__ import annotations

from torch import nn

from vit.errors import UserValueError
from vit.nn.vision import VisionTransformer

STRATEGIES = ("full", "linear_probe", "partial", "staged")


def check_strategy(finetune: str, freeze_blocks: int, head_epochs: int, depth: int) -> None:
    """A clear error for a strategy name or setting that cannot work."""
    if finetune not in STRATEGIES:
        raise UserValueError(f"model.finetune must be one of {STRATEGIES}, got {finetune!r}")
    if finetune == "partial" and not 0 < freeze_blocks <= depth:
        raise UserValueError(f"finetune: partial needs 0 < freeze_blocks <= depth ({depth}), got {freeze_blocks}")
    if finetune == "staged" and head_epochs < 1:
        raise UserValueError(f"finetune: staged needs head_epochs >= 1, got {head_epochs}")


def frozen_modules(model: VisionTransformer, finetune: str, freeze_blocks: int, head_epochs: int,
                   epoch: int) -> list[nn.Module]:
    """The modules that do not train in ``epoch``; the cls token and position embedding follow the patch embedding."""
    blocks = list(model.blocks)
    if finetune == "linear_probe" or (finetune == "staged" and epoch < head_epochs):
        return [model.patch_embed, model.norm_pre, *blocks, model.norm, model.fc_norm]
    if finetune == "partial":  # norm_pre (CLIP's) sits between the embedding and the first block
        return [model.patch_embed, model.norm_pre, *blocks[:freeze_blocks]]
    return []


def apply_freezing(model: VisionTransformer, frozen: list[nn.Module]) -> None:
    """Turn gradients off (and eval mode on) for ``frozen``, and on for the rest."""
    frozen_ids = {id(p) for module in frozen for p in module.parameters()}
    embeddings_frozen = any(module is model.patch_embed for module in frozen)
    for name, p in model.named_parameters():
        embedding = name in ("cls_token", "reg_token", "dist_token", "pos_embed")
        trainable = id(p) not in frozen_ids and not (embeddings_frozen and embedding)
        p.requires_grad_(trainable)
    for module in frozen:
        module.eval()


def unfreeze_epoch(finetune: str, head_epochs: int) -> int | None:
    """The epoch where a staged fine-tuning starts training the backbone (its warm-up starts again)."""
    return head_epochs if finetune == "staged" else None
