"""What ``--ckpt_path`` names, read before LightningCLI rebuilds a model from it (where a damaged file or another
task's checkpoint fails obscurely): ``best`` and ``last`` found in the config's checkpoint folders, ``last`` checked
whole (or the newest intact one, with ``--resume_from_readable``), a missing file named beside those that exist, and
a checkpoint of another task, or of 0.1's classifier, named before anything loads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from vit.checkpoints.io import (
    DamagedCheckpointError,
    checkpoint_progress,
    damaged_message,
    is_intact,
    missing_message,
    read_checkpoint,
)
from vit.checkpoints.meta import expect_task, task_of
from vit.checkpoints.runs import checkpoint_by_name, checkpoint_folders
from vit.cli.parser import imported_class
from vit.errors import UserPathError, UserValueError


def resolved_path(config: Any) -> str:
    """``--ckpt_path`` as a file: ``best`` and ``last`` found in the config's checkpoint folders ('' for none)."""
    path = str(config["ckpt_path"])
    if path not in ("best", "last"):
        return path
    try:
        return checkpoint_by_name(config, path)
    except UserPathError:
        return ""


def resolve_last(config: Any, say: Callable[[str], None]) -> str:
    """The checkpoint ``--ckpt_path last`` resumes from: an intact last*.ckpt, or a clear error."""
    # Lightning only warns when there is nothing to resume from; a user asked to resume.
    fall_back = config.get("resume_from_readable")
    found = checkpoint_by_name(config, "last")
    if is_intact(found):
        return found
    folder = Path(found).parent
    intact = [p for p in sorted(folder.glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
              if p != Path(found) and is_intact(p)]
    if not fall_back or not intact:
        hint = "" if fall_back else " (or --resume_from_readable true to resume from the newest intact one)"
        raise DamagedCheckpointError(
            damaged_message(found, "not a complete torch zip file")
            + f"\nResume from one of them with --ckpt_path PATH{hint}."
        )
    epoch, step = checkpoint_progress(intact[0])
    say(f"--ckpt_path last: {found} is damaged; falling back to the newest intact checkpoint, {intact[0]} "
        f"(epoch {epoch}, step {step})")
    return str(intact[0])


def model_task(class_path: str) -> str | None:
    """The registry's task (`vit.checkpoints.meta.TASK_CLASSES`) of the model class ``class_path`` names, or None."""
    from vit.tasks import TASKS

    bare = class_path.rpartition(".")[2]  # a bare class name: one of the package's
    task = getattr(imported_class(class_path) or next((c for c in TASKS.values() if c.__name__ == bare), None),
                   "task", None)
    return task if task in TASKS else None


def check_checkpoint_exists(config: Any) -> None:
    """A short error listing the checkpoints that exist when ``--ckpt_path`` names a file that does not (Lightning's
    own is a traceback from deep in its loading)."""
    ckpt_path = config.get("ckpt_path")
    if not ckpt_path or ckpt_path in ("best", "last", "hpc", "registry") or "://" in str(ckpt_path):
        return  # Lightning's names (`fit --ckpt_path last` is resolved in before_fit), and remote paths
    if not Path(ckpt_path).exists():
        raise UserPathError(missing_message(ckpt_path, checkpoint_folders(config)))


def check_checkpoint_task(config: Any) -> None:
    """A clear error when ``--ckpt_path`` is damaged, or holds another task than the configured model."""
    ckpt_path = config.get("ckpt_path")
    class_path = (config.get("model") or {}).get("class_path")
    if not ckpt_path or not Path(ckpt_path).is_file() or not class_path:
        return
    checkpoint = read_checkpoint(ckpt_path, mmap=True)  # a damaged file: an error naming it and its neighbours
    wanted = model_task(class_path)
    if wanted:  # a task of the registry, subclasses included (another task is checked by its on_load_checkpoint)
        expect_task(checkpoint, wanted, f"--ckpt_path {ckpt_path}")
    from vit.tasks.classify import ImageClassifier
    from vit.tasks.compat import old_arguments

    # only a classifier's: a Translator's lr and warmup_steps are its own arguments still
    old = old_arguments(checkpoint.get("hyper_parameters") or {}) if task_of(checkpoint) == ImageClassifier.task else []
    if old:
        # LightningCLI reads the checkpoint's hyperparameters into the config, where 0.1's flat ones are no option
        raise UserValueError(
            f"--ckpt_path {ckpt_path} was written by vit 0.1, whose classifier took {', '.join(old[:3])}, ... where "
            "this version takes optim and head. Its weights and classes read as they are: vit predict --ckpt, "
            "vit export --ckpt, vit.tasks.load_task(path, ImageClassifier); to train on from them, start a run "
            f"with --model.init_args.pretrained {ckpt_path}")


__all__ = ["check_checkpoint_exists", "check_checkpoint_task", "model_task", "resolve_last", "resolved_path"]
