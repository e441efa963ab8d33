"""The classifier's older spellings, and how they read now. Two kinds:

* arguments that live elsewhere (`MOVED`): 0.1's flat ``lr``, ``label_smoothing``, ... now in ``optim`` and
  ``head``; `vit fit`'s parser names the new place, and `upgraded_hparams` reads a 0.1 checkpoint's;
* spellings that still work, with one line naming the new one (`upgraded_arguments`): fine-tuning as a string with
  its settings beside it, and the normalisation as four arguments::

    finetune: lora                               finetune:
    head_epochs: 1                       ->        class_path: vit.tasks.finetune.Adapters
    lora: {rank: 16}                               init_args: {rank: 16, head_epochs: 1}

    mean: [0.5], std: [0.5], crop_pct: 0.9  ->  preprocessing: {mean: [0.5], std: [0.5], crop_pct: 0.9}

    multi_label: true                        ->  label_kind: multi

  They are read wherever a classifier's arguments come in: a config or command line (`vit.cli.parser`), the Python
  constructor, a checkpoint's hyperparameters (`vit.tasks.load_task`, ``vit fit --ckpt_path``).
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Mapping
from typing import Any

from vit.errors import UserValueError
from vit.preprocessing import PREPROCESSING_KEYS
from vit.tasks.heads import data_label_kind

_DISTILLED = "class_path: vit.tasks.DistilledClassifier"
# The arguments of 0.1's ImageClassifier that live elsewhere now, and where: a key under model.init_args, or the
# class that takes them. `vit fit`'s parser names the new place when a config gives an old key.
MOVED: dict[str, str] = {
    **{name: f"optim.{name}" for name in ("lr", "lr_base_batch", "weight_decay", "betas", "warmup_epochs",
                                          "warmup_steps", "min_lr", "schedule", "layer_decay", "ema_decay")},
    **{name: f"head.init_args.{name}" for name in ("label_smoothing", "mixup_alpha", "cutmix_alpha", "mixup_prob",
                                                   "mixup_switch_prob", "class_weighting")},
    **{name: _DISTILLED for name in ("distillation", "teacher", "teacher_weights", "teacher_dir", "distill_alpha",
                                     "distill_tau")},
}

# ``finetune``'s old strings -> the strategy classes (`vit.tasks.finetune`)
STRATEGIES = {"full": "Full", "linear_probe": "LinearProbe", "partial": "Partial", "staged": "Staged",
              "lora": "Adapters", "dora": "Adapters"}
FINETUNE_MODULE = "vit.tasks.finetune"
SETTINGS = ("freeze_blocks", "head_epochs", "lora")  # the old strings' settings, arguments of their own
USES = {"partial": ("freeze_blocks",), "staged": ("head_epochs",), "lora": ("head_epochs", "lora"),
        "dora": ("head_epochs", "lora")}  # which of them each string read (the others it ignored)


def old_arguments(hparams: Mapping[str, Any]) -> list[str]:
    """The arguments of 0.1's classifier among a checkpoint's hyperparameters (``lr``, ``label_smoothing``, ...,
    which now live in ``optim`` and ``head``); none for a checkpoint of this version."""
    return [k for k in hparams if k in MOVED and MOVED[k] != _DISTILLED]


def upgraded_hparams(hparams: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any] | None:
    """A checkpoint's hyperparameters (``meta``: its ``checkpoint["vit"]``) as this version's arguments: 0.1's flat
    ``lr``, ``label_smoothing``, ... as ``optim`` and ``head``, and the old spellings `upgraded_arguments` reads;
    None for a checkpoint of this version."""
    upgraded, notes = upgraded_arguments(hparams)
    if not old_arguments(hparams):
        return upgraded if notes else None
    moved = lambda prefix: {k: v for k, v in upgraded.items() if MOVED.get(k, "").startswith(prefix)}
    distilling = upgraded.get("distillation", "none") != "none"
    keep = lambda k: not k.startswith("_") and (k not in MOVED or (distilling and MOVED[k] == _DISTILLED))
    kept = {k: v for k, v in upgraded.items() if keep(k)}  # _class_path, _instantiator: the new class decides
    head = {"class_path": "vit.tasks.heads.SingleLabelHead", "init_args": moved("head.")}
    backbone = {"backbone": "timm"} if meta.get("model_source") == "timm" else {}
    return {**kept, **backbone, "optim": moved("optim."), "head": head}


def upgraded_arguments(args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A classifier's arguments (all or some: a config file's, one command-line key) with the old spellings of the
    module docstring written the new way, and one line for each old spelling met."""
    args, notes = dict(args), []
    given = {k: args.pop(k) for k in SETTINGS if k in args}
    finetune = args.get("finetune")
    if isinstance(finetune, str) and finetune.islower():  # (not a class's name: Staged, vit.tasks.finetune.Staged)
        args["finetune"] = strategy_named(finetune, given)
        notes.append(f"model.init_args.finetune: {finetune}{_listed(given, USES.get(finetune, ()))} is written "
                     f"finetune: {_flow(args['finetune'])} now")
    elif settings := {k: v for k, v in _settings(given, SETTINGS).items() if v}:  # 0 and None: the old defaults
        spec = _spec(finetune)
        spec["init_args"] = {**(spec.get("init_args") or {}), **settings}
        args["finetune"] = spec
        notes.append(f"model.init_args.{{{', '.join(given)}}} are written finetune: {_flow(spec)} now")
    old = {k: args.pop(k) for k in PREPROCESSING_KEYS if k in args}
    if old and args.get("preprocessing") is None:  # (given both, the record wins: the CLI links the data's mean too)
        args["preprocessing"] = {k: v for k, v in old.items() if v is not None} or None
        notes.append(f"model.init_args.{{{', '.join(old)}}} are written preprocessing: {{{', '.join(old)}}} now "
                     "(linked from the data)")
    if "multi_label" in args:  # (Lightning would drop the unknown key and rebuild a single-label task)
        multi = args.pop("multi_label")
        args["label_kind"] = args.get("label_kind") or data_label_kind(multi)
        notes.append(f"model.init_args.multi_label: {multi} is written label_kind: {args['label_kind']} now "
                     "(linked from the data)")
    return args, notes


def read_old_spellings(hparams: dict[str, Any], cls: type) -> None:
    """A ``cls`` task's hyperparameters, in place, with the old spellings read the new way (a warning each); an
    argument no version of it took is an error, as Python's own (0.1's ``lr``: where it lives now)."""
    upgraded, notes = upgraded_arguments(hparams)
    accepted = {name for klass in cls.__mro__ if "__init__" in vars(klass)
                for name in inspect.signature(vars(klass)["__init__"]).parameters}
    if unknown := [k for k in upgraded if k not in accepted and not k.startswith("_")]:  # _class_path: the CLI's
        moved = "; ".join(f"{k} moved to {MOVED[k]}" for k in unknown if k in MOVED)
        raise TypeError(f"{cls.__name__} got unexpected keyword arguments {unknown}" + (f" ({moved})" if moved else ""))
    hparams.clear()
    hparams.update(upgraded)
    warn_old(notes)


def strategy_named(name: str, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The strategy an old ``finetune`` string names, as a config writes it, with the settings it read
    (``freeze_blocks``, ``head_epochs``, ``lora``)."""
    settings = dict(settings or {})
    if name not in STRATEGIES:
        raise UserValueError(f"model.finetune must be one of {', '.join(STRATEGIES)} (the old names) or a class "
                             f"of vit.tasks.finetune (Full, LinearProbe, Partial, Staged, Adapters), got {name!r}")
    if settings.get("lora") and name not in ("lora", "dora"):
        raise UserValueError(f"model.lora sets adapters, which finetune: {name} does not train: use finetune: lora "
                             "or dora, or leave lora out")
    init = _settings(settings, USES.get(name, ()))
    if name == "partial":
        init.setdefault("freeze_blocks", 0)  # (0 was the default, which Partial refuses, as it did)
    if name == "staged":
        init.setdefault("head_epochs", 0)
    if name == "dora":
        init["dora"] = True
    return {"class_path": f"{FINETUNE_MODULE}.{STRATEGIES[name]}", **({"init_args": init} if init else {})}


def _settings(given: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The strategy's init_args from the old settings ``names`` among ``given`` (``lora`` spread out)."""
    init = {k: given[k] for k in names if k != "lora" and given.get(k) is not None}
    lora = given.get("lora") if "lora" in names else None
    if lora is not None:
        init.update(lora if isinstance(lora, Mapping) else _fields(lora))
    return init


def _spec(value: Any) -> dict[str, Any]:
    """A strategy (or its config, or None) as ``{class_path, init_args}``, to add settings to."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {**value, "init_args": dict(value.get("init_args") or {})}
    cls = type(value)
    return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": _fields(value)}


def _fields(value: Any) -> dict[str, Any]:
    """A settings object's fields (a namespace's keys), as a dict."""
    if dataclasses.is_dataclass(value):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return dict(vars(value)) if hasattr(value, "__dict__") else dict(value)


def _listed(given: Mapping[str, Any], used: tuple[str, ...]) -> str:
    """`` with head_epochs, lora`` for the settings an old string read."""
    named = [k for k in used if given.get(k) is not None]
    return f" (with {', '.join(named)})" if named else ""


def _flow(spec: Any) -> str:
    """A value in YAML's one-line form."""
    import yaml

    plain = lambda v: {k: plain(x) for k, x in v.items()} if isinstance(v, Mapping) else \
        list(map(plain, v)) if isinstance(v, (list, tuple)) else v
    return yaml.safe_dump(plain(spec), default_flow_style=True, sort_keys=False, width=10**6).strip()


def warn_old(notes: list[str]) -> None:
    """One line for each old spelling met (a FutureWarning: shown once per line)."""
    for note in notes:
        warnings.warn(note, FutureWarning, stacklevel=4)


__all__ = ["MOVED", "STRATEGIES", "old_arguments", "read_old_spellings", "strategy_named", "upgraded_arguments",
           "upgraded_hparams", "warn_old"]
