"""What a test run got wrong, as pictures: the most confident mistakes with their attention rollout, and the
accuracy per class. Written into the run folder beside the confusion matrix, and logged as images to
TensorBoard or W&B when they are the run's loggers.

The mistakes are kept while the test batches stream by (the top ``n`` by confidence, on the CPU); the rollout
is computed at the end from the model under test, so the overlays are that checkpoint's own attention.
Under DDP each rank sees its shard of the test set: the grid shows rank 0's mistakes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.explain import collect_attention, overlay, to_display_image
from vit.nn.vision import VisionTransformer
from vit.reports import class_accuracy_figure, error_grid_figure, save_figure

log = logging.getLogger(__name__)


class ConfidentMistakes:
    """The ``n`` test images predicted wrong with the highest probability, as (image, true, predicted, p)."""

    def __init__(self, n: int = 16) -> None:
        self.n = n
        self.reset()

    def reset(self) -> None:
        """Forget every mistake kept so far."""
        self.images = torch.empty(0)
        self.true = torch.empty(0, dtype=torch.long)
        self.predicted = torch.empty(0, dtype=torch.long)
        self.confidence = torch.empty(0)

    @torch.no_grad()
    def update(self, images: Tensor, logits: Tensor, labels: Tensor) -> None:
        """Keep this batch's mistakes if they are among the ``n`` most confident so far."""
        confidence, predicted = logits.float().softmax(dim=-1).max(dim=-1)
        wrong = predicted != labels
        if not wrong.any() or self.n <= 0:
            return
        images = images[wrong].detach().float().cpu()
        if len(self.images) == 0:
            self.images = images[:0]
        self.images = torch.cat([self.images, images])
        self.true = torch.cat([self.true, labels[wrong].cpu()])
        self.predicted = torch.cat([self.predicted, predicted[wrong].cpu()])
        self.confidence = torch.cat([self.confidence, confidence[wrong].cpu()])
        keep = self.confidence.argsort(descending=True, stable=True)[: self.n]
        self.images, self.true = self.images[keep], self.true[keep]
        self.predicted, self.confidence = self.predicted[keep], self.confidence[keep]

    def __len__(self) -> int:
        return len(self.true)


def save_error_report(
    model: VisionTransformer, mistakes: ConfidentMistakes, class_accuracy: Sequence[float],
    class_names: Sequence[str], mean: Sequence[float], std: Sequence[float], out_dir: str | Path,
) -> dict[str, Any]:
    """Write ``errors.png`` (the mistakes with their rollout overlays; none when there are no mistakes) and
    ``class_accuracy.png`` to ``out_dir``; returns the matplotlib figures by name, for loggers."""
    figures = {"class_accuracy": class_accuracy_figure(list(class_accuracy), list(class_names))}
    if len(mistakes):
        device = next(model.parameters()).device
        images = [to_display_image(x, mean, std, min_side=64) for x in mistakes.images]
        overlays = images  # a timm convnet (`backbone: timm`) has no attention to roll out
        if isinstance(model, VisionTransformer):
            rollout = collect_attention(model, mistakes.images.to(device)).rollout().cpu()  # (B, h, w)
            overlays = [overlay(image, heat) for image, heat in zip(images, rollout)]
        captions = [f"true {class_names[t]}, predicted {class_names[p]} ({c:.0%})" for t, p, c in
                    zip(mistakes.true.tolist(), mistakes.predicted.tolist(), mistakes.confidence.tolist())]
        figures["errors"] = error_grid_figure(images, overlays, captions)
    for name, fig in figures.items():
        save_figure(fig, Path(out_dir) / f"{name}.png")
    return figures


def log_figures(loggers: Sequence[Any], figures: dict[str, Any], step: int, prefix: str = "test") -> None:
    """Log the figures as images, named ``prefix/name``, to the TensorBoard and W&B loggers among ``loggers``
    (others have no images)."""
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

    from vit.reports import png_bytes

    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            for name, fig in figures.items():
                logger.experiment.add_figure(f"{prefix}/{name}", fig, global_step=step, close=False)
        elif isinstance(logger, WandbLogger):
            import io

            from PIL import Image

            images = [Image.open(io.BytesIO(png_bytes(fig))) for fig in figures.values()]
            logger.log_image(key=f"{prefix}/figures", images=images, caption=list(figures), step=step)


def test_figures(task: Any, confusion: Tensor, per_class: Sequence[float]) -> None:
    """A single-label classifier's test figures in its run folder (rank 0): the confusion matrix, per-class
    accuracy and the most confident mistakes, logged to its loggers too."""
    from lightning.pytorch.utilities import rank_zero_info

    from vit.reports import save_confusion_matrix

    out_dir = task.trainer.log_dir  # the logger's run folder, else default_root_dir
    if out_dir is None or not task.trainer.is_global_zero:
        return
    path = save_confusion_matrix(confusion, task.class_names, Path(out_dir) / "confusion_matrix.png")
    figures = save_error_report(task.eval_model, task.test_mistakes, per_class, task.class_names, task.mean,
                                task.std, out_dir)
    log_figures(task.trainer.loggers, figures, task.global_step)
    rank_zero_info(f"confusion matrix, per-class accuracy and most confident mistakes saved to {path.parent} "
                   "(confusion_matrix.png, class_accuracy.png, errors.png)")
