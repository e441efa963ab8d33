"""Run folders: where `vit fit` puts a config's runs and checkpoints, and the newest, best or last of them.

`vit fit --ckpt_path best|last`, a student's ``teacher: best`` and the output folders of `vit probe` and
`vit audit` all find their files here. Lightning-free: a config is read as the parsed mapping it is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vit.checkpoints.io import newest_checkpoint
from vit.errors import UserPathError


def run_checkpoint_folders(experiment: str | os.PathLike) -> list[Path]:
    """The ``<version>/checkpoints`` folders Lightning's logger made below ``experiment``, the run that saved a
    checkpoint last first."""
    runs = [folder for folder in Path(experiment).glob("*/checkpoints") if folder.is_dir()]
    return sorted(runs, key=lambda folder: max((p.stat().st_mtime for p in folder.glob("*.ckpt")), default=0.0),
                  reverse=True)


def new_run_folder(folder: Path) -> Path:
    """A new ``folder/version_N``, N one past the largest there (as Lightning's loggers number runs)."""
    while True:
        versions = [int(p.name[8:]) for p in folder.glob("version_*") if p.name[8:].isdigit()]
        path = folder / f"version_{max(versions, default=-1) + 1}"
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:  # another run took it meanwhile
            continue


def experiment_folder(trainer: Any) -> Path:
    """The folder `vit fit` puts this config's runs in (``version_N`` under it): the logger's save_dir/name;
    without a logger setting, `vit fit`'s CSVLogger in default_root_dir (else the working directory)."""
    root = Path(trainer.get("default_root_dir") or ".")  # `vit fit` says os.getcwd(): the same folder
    logger = trainer.get("logger")
    if isinstance(logger, list | tuple):  # several loggers: Lightning's log_dir is the first's
        logger = logger[0] if logger else False
    if logger is None or logger is True:
        return root / "lightning_logs"
    if logger is False:  # `vit fit` logs nothing; its checkpoints go to default_root_dir
        return root
    init_args = getattr(logger, "init_args", None) or {}
    get = init_args.get if hasattr(init_args, "get") else lambda key: getattr(init_args, key, None)
    return Path(get("save_dir") or root) / str(get("name") or "")


def checkpoint_folders(config: Any) -> list[Path]:
    """Where this config's runs write their checkpoints: ``checkpoint.dirpath``; or, unset, each run's own folder as
    Lightning names it, the logger's ``save_dir/name/<version>/checkpoints`` (``default_root_dir/checkpoints``
    without a logger), newest run first."""
    dirpath = (config.get("checkpoint") or {}).get("dirpath")
    if dirpath:
        return [Path(dirpath)]
    trainer = config.get("trainer") or {}
    experiment = experiment_folder(trainer)
    if trainer.get("logger") is False:
        return [experiment / "checkpoints"]
    return run_checkpoint_folders(experiment) or [experiment / "<version>" / "checkpoints"]


def checkpoint_by_name(config: Any, which: str) -> str:
    """``--ckpt_path best|last``: the latest run's best checkpoint (its best even with checkpoint.save_top_k above 1)
    or its newest last*.ckpt, in the config's checkpoint folder (`checkpoint_folders`), so a command need not name
    one run's file."""
    folders = checkpoint_folders(config)
    for folder in folders:  # the newest run that has one
        if (found := newest_checkpoint(folder, which)) is not None:
            return str(found)
    where = ", ".join(map(str, folders[:3])) + (f" and {len(folders) - 3} more" if len(folders) > 3 else "")
    raise UserPathError(f"--ckpt_path {which}: no {which} checkpoint in {where}; run `vit fit` with this config "
                        "first, set checkpoint.dirpath to the run's checkpoint folder, or pass --ckpt_path PATH")
