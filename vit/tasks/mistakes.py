"""One label per image: its evaluation (`SingleLabelEvaluation`: the head's metrics per stage, the test's accuracy
per class, confusion matrix and most confident mistakes), and what a test run got wrong, as pictures: the most
confident mistakes with their attention rollout, and the accuracy per class. Written into the run folder beside the
confusion matrix, and logged as images to TensorBoard or W&B when they are the run's loggers.

The mistakes are kept while the test batches stream by (the top ``n`` by confidence, on the CPU); the rollout
is computed at the end from the model under test, so the overlays are that checkpoint's own attention.
Under DDP each rank sees its shard of the test set: the grid shows rank 0's mistakes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from vit.explain import collect_attention, overlay, to_display_image
from vit.nn.vision import VisionTransformer
from vit.reports import class_accuracy_figure, error_grid_figure, save_figure
from vit.tasks.evaluation import Evaluation, Run

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


def test_figures(run: Run, confusion: Tensor, per_class: Sequence[float], mistakes: ConfidentMistakes) -> None:
    """A single-label classifier's test figures in its run folder (rank 0): the confusion matrix, per-class
    accuracy and the most confident mistakes, logged to its loggers too."""
    from lightning.pytorch.utilities import rank_zero_info

    from vit.reports import save_confusion_matrix

    if run.out_dir is None or not run.is_global_zero:  # out_dir: the logger's run folder, else default_root_dir
        return
    path = save_confusion_matrix(confusion, run.class_names, Path(run.out_dir) / "confusion_matrix.png")
    figures = save_error_report(run.model, mistakes, per_class, run.class_names, run.mean, run.std, run.out_dir)
    log_figures(run.loggers, figures, run.step)
    rank_zero_info(f"confusion matrix, per-class accuracy and most confident mistakes saved to {path.parent} "
                   "(confusion_matrix.png, class_accuracy.png, errors.png)")


class SingleLabelEvaluation(Evaluation):
    """One label per image: the head's validation metrics per stage (``val_acc``, ...), and in test each class's
    accuracy, the confusion matrix and the ``mistakes`` most confident mistakes, with their figures."""

    def __init__(self, metrics: MetricCollection, num_classes: int, mistakes: int = 16) -> None:
        super().__init__()
        self.metrics = nn.ModuleDict({"val": metrics.clone(prefix="val_"), "test": metrics.clone(prefix="test_")})
        self.class_acc = MulticlassAccuracy(num_classes, average=None)
        self.confusion = MulticlassConfusionMatrix(num_classes)
        self.mistakes = ConfidentMistakes(mistakes)  # errors.png: the most confident mistakes, with rollout
        self.last_confusion_matrix: Tensor | None = None  # the last test's, (true, predicted)

    def step(self, stage: str, images: Tensor, logits: Tensor, targets: Tensor) -> Mapping[str, Any]:
        """Update the stage's metrics (logged as they are: Lightning computes them per epoch); in test also the
        per-class accuracy, confusion matrix and mistakes."""
        self.metrics[stage].update(logits, targets)
        if stage == "test":
            self.class_acc.update(logits, targets)
            self.confusion.update(logits, targets)
            self.mistakes.update(images, logits, targets)
        return self.metrics[stage]

    def end(self, stage: str, run: Run) -> dict[str, float]:
        """After test: each class's accuracy (``test_acc_class/NAME``) and the figures; nothing after val."""
        if stage != "test":
            return {}
        from lightning.pytorch.utilities import rank_zero_info

        confusion = self.confusion.compute().cpu()  # already global: torchmetrics syncs ranks on compute
        # A class without test images has no accuracy (torchmetrics says 0.0): NaN, left out and said.
        per_class = self.class_acc.compute().cpu().masked_fill(confusion.sum(1) == 0, float("nan")).tolist()
        # averaging equal values across ranks changes nothing, and tells Lightning it is synced
        values = {f"test_acc_class/{name}": acc for name, acc in zip(run.class_names, per_class) if acc == acc}
        if absent := [name for name, acc in zip(run.class_names, per_class) if acc != acc]:
            rank_zero_info(f"no test images of {', '.join(map(repr, absent))}: no test accuracy for them")
        self.class_acc.reset()
        self.confusion.reset()
        self.last_confusion_matrix = confusion
        test_figures(run, confusion, per_class, self.mistakes)
        self.mistakes.reset()
        return values


__all__ = ["ConfidentMistakes", "SingleLabelEvaluation", "log_figures", "save_error_report", "test_figures"]
