"""Fail in seconds when a config's pretrained weights cannot be had, before Lightning is imported.

`vit fit|validate|test|predict|probe --config ...` parse their configs with LightningCLI, and importing Lightning
takes many seconds on a small machine (through torchmetrics it imports torchvision, torch._dynamo and scipy;
docs/development.md times it). Weights
that are neither on disk nor in the Hugging Face cache, with the hub unreachable, would only fail after all that.
So the command line's ``model.init_args.pretrained`` is read here for the forms people write (``--config FILE``,
``--model.init_args.pretrained VALUE``, in order, the last one winning, as jsonargparse reads them), and checked
with `vit.checkpoints.weights.check_available`. Any other form, ``--ckpt_path`` (the checkpoint holds the weights) or a
``--help`` checks nothing here: LightningCLI's own parse still does every check.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

OVERRIDES = ("--model.init_args.pretrained", "--model.pretrained")
CONFIGS = ("--config", "-c")
# Options after which the model's weights are not (only) what the configs and overrides say.
UNFOLLOWED = ("--model", "--model.class_path", "--ckpt_path", "--help", "-h", "--print_config")
NULLS = ("null", "Null", "NULL", "~", "")  # YAML's nulls, as jsonargparse reads a value (and '' loads nothing)


class NotFollowed(Exception):
    """The command line sets the weights in a form this module does not follow."""


def configured_pretrained(args: Sequence[str]) -> str | None:
    """The ``model.init_args.pretrained`` of a `vit fit`-style command line (the command's own arguments, after
    its name), or None when it sets none or sets it in a form not followed here."""
    try:
        return _read(list(args))
    except NotFollowed:
        return None


def check_pretrained(args: Sequence[str]) -> None:
    """Raise `vit.errors.UserPathError` / `WeightsUnavailableError` when the weights the command line names
    cannot be had (a missing file; a timm name not cached, with the hub unreachable or offline mode set)."""
    source = configured_pretrained(args)
    if source:
        from vit.checkpoints.weights import check_available

        check_available(source)


def _read(args: list[str]) -> str | None:
    value: str | None = None
    classifier = False  # whether a config has named the model class yet (before that, jsonargparse refuses init_args)
    for i, arg in enumerate(args):
        option, eq, given = arg.partition("=")
        if option in UNFOLLOWED:  # --print_config=skip_null included: its option is the part before "="
            raise NotFollowed
        if option in CONFIGS or option in OVERRIDES:
            if eq:
                operand = given
            elif i + 1 < len(args):
                operand = args[i + 1]
            else:
                raise NotFollowed
            if option in CONFIGS:
                value, classifier = _from_config(operand, value, classifier)
            elif classifier:
                value = _scalar(operand)
            else:
                raise NotFollowed
    return value


def _from_config(file: str, value: str | None, classifier: bool) -> tuple[str | None, bool]:
    """(the value, whether the model is an ImageClassifier) after applying one config file: the file's own value,
    if it sets one. A file setting the checkpoint, or the model in another form or of another class, is not
    followed."""
    try:
        config = yaml.safe_load(Path(file).read_text())
    except (OSError, yaml.YAMLError):
        raise NotFollowed from None  # LightningCLI names the file and what is wrong with it
    if not isinstance(config, dict):
        raise NotFollowed
    if config.get("ckpt_path"):
        raise NotFollowed
    model = config.get("model")
    if model is None:
        return value, classifier
    if not isinstance(model, dict):
        raise NotFollowed
    if "class_path" in model:
        if str(model["class_path"]).rsplit(".", 1)[-1] != "ImageClassifier":
            raise NotFollowed  # another task: its own arguments
        classifier = True
    init_args = model.get("init_args") or {}
    if not isinstance(init_args, dict) or not classifier:
        raise NotFollowed
    return (_scalar(init_args["pretrained"]) if "pretrained" in init_args else value), classifier


def _scalar(given: Any) -> str | None:
    if given is None or (isinstance(given, str) and given.strip() in NULLS):
        return None
    if not isinstance(given, str):
        raise NotFollowed
    return given
