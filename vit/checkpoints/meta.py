"""What a `vit` checkpoint says about itself: ``checkpoint["vit"]``, written by every task.

The task (a key of `TASK_CLASSES`, the one registry of tasks; `expect_task` checks it) and, for a classifier, the
model config, class names and the image preparation (size, mean/std, crop_pct, interpolation), so the trained model
is rebuilt from the file alone (`vit.deploy.load_classifier`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from torch import Tensor

from vit.errors import UserValueError

META_KEY = "vit"  # checkpoint["vit"]: what the task wrote for loading without the training config
# A multi-label classifier says so under this key, with its cut per class: {"multi_label": true, "thresholds": [...]}
# in a checkpoint's meta and a timm folder's config.json, {"multi_label": {"thresholds": [...]}} in an ONNX file's
# metadata (`vit.deploy.metadata`); no key: one label per image. `label_meta` writes it, `label_thresholds` reads it.
MULTI_LABEL_KEY = "multi_label"
THRESHOLDS_KEY = "thresholds"


def label_meta(thresholds: Sequence[float] | None) -> dict[str, Any]:
    """What a classifier's meta says about its labels: a multi-label one's flag and cut per class; nothing for one
    label per image (``thresholds`` None)."""
    if thresholds is None:
        return {}
    return {MULTI_LABEL_KEY: True, THRESHOLDS_KEY: [float(t) for t in thresholds]}


def label_thresholds(meta: Mapping[str, Any]) -> list[float] | None:
    """A multi-label classifier's cut per class from its meta (a checkpoint's or a timm folder's config), or None for
    one label per image: the one reading of the label kind of a file."""
    if not meta.get(MULTI_LABEL_KEY):
        return None
    return [float(t) for t in meta[THRESHOLDS_KEY]]


def classify_meta(model_name: str, model_config: Mapping[str, Any], class_names: Sequence[str],
                  preprocessing: Mapping[str, Any], **more: Any) -> dict[str, Any]:
    """A classifier's ``checkpoint["vit"]``, the one writer of it (`vit fit`'s and `vit zeroshot`'s): the network by
    name and config, the classes, the input preparation (``Preprocessing.to_dict()``) and ``more`` (``ema``, the
    backbone's, `label_meta`, the adapters')."""
    return {"task": "classify", "model_name": model_name, "model_config": dict(model_config),
            "class_names": list(class_names), **preprocessing, **more}
# The one prefix table of a classifier's state dict: its network under "model.", the EMA copy (when training kept
# one) under "model_ema.module.", the copy it validated and tested.
MODEL_PREFIX, EMA_PREFIX = "model.", "model_ema.module."
STATE_PREFIXES = (MODEL_PREFIX, EMA_PREFIX)


def classifier_checkpoint(meta: dict[str, Any], weights: dict[str, Tensor], **extra: Any) -> dict[str, Any]:
    """A `vit fit`-format classify checkpoint outside a Trainer (`vit probe`'s): a VisionTransformer's ``weights``
    as the evaluated ones, ``meta`` from ``ImageClassifier.checkpoint_meta()``, and ``extra`` entries."""
    state = {MODEL_PREFIX + k: v.detach().cpu().clone() for k, v in weights.items()}
    # The weights are under MODEL_PREFIX, whichever copy (EMA or not) they came from.
    return {META_KEY: {**meta, "ema": False}, "state_dict": state, **extra}


class TaskEntry(NamedTuple):
    """A task a checkpoint can hold: its LightningModule (an import path) and the command that writes it."""

    class_path: str
    command: str

    @property
    def class_name(self) -> str:
        """The LightningModule's class name: "ImageClassifier"."""
        return self.class_path.rpartition(".")[2]


# The one registry of tasks: checkpoint["vit"]["task"] -> its entry. `vit.tasks.TASKS` is this table with the
# classes imported; they are named here, not imported, since nothing in `vit.checkpoints` imports Lightning.
TASK_CLASSES: dict[str, TaskEntry] = {
    "classify": TaskEntry("vit.tasks.ImageClassifier", "vit fit"),
    "pretrain": TaskEntry("vit.tasks.MaskedAutoencoder", "vit pretrain"),
    "translate": TaskEntry("vit.tasks.Translator", "vit fit"),
    "contrastive": TaskEntry("vit.tasks.ContrastiveTask", "vit fit"),
}


def task_of(checkpoint: dict[str, Any]) -> str | None:
    """The task a `vit` checkpoint was written by (a key of `TASK_CLASSES`), or None."""
    meta = checkpoint.get(META_KEY)
    return meta.get("task") if isinstance(meta, dict) else None


def expect_task(checkpoint: dict[str, Any], task: str, where: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's ``vit`` entry, or the error saying which task it holds instead.

    The one check that a checkpoint belongs to a task: loading a classifier, `load_task`, ``--ckpt_path`` in the
    CLI and each task's ``on_load_checkpoint`` all come here. ``where`` names the file for the message.
    """
    found = task_of(checkpoint)
    if found != task:
        entry = TASK_CLASSES.get(task)  # a task outside the table (a user's) is named, not looked up
        fix = f": give a checkpoint that `{entry.command}` wrote with {entry.class_path}" if entry else ""
        raise UserValueError(f"{where} holds {describe_task(found)}, but {describe_task(task)} is needed here{fix}")
    return checkpoint[META_KEY]


def describe_task(task: str | None) -> str:
    """A task in words: "the Translator task ('translate')"."""
    if task is None:
        return "no `vit` task (no checkpoint['vit'] entry of `vit fit` or `vit pretrain`)"
    if task not in TASK_CLASSES:
        return f"an unknown task {task!r}"
    return f"the {TASK_CLASSES[task].class_name} task ({task!r})"


def evaluated_weights(state_dict: dict[str, Tensor], ema: bool) -> dict[str, Tensor]:
    """The VisionTransformer's weights inside an ImageClassifier's state dict: the EMA copy if trained with one."""
    prefix = EMA_PREFIX if ema else MODEL_PREFIX
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
