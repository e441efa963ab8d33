"""`vit fit`'s argument parser, whose errors are for a person: a few lines naming the key, the file and the
nearest valid name, instead of argparse's usage and a dump of jsonargparse's Union validation."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import itertools
import json
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, NoReturn

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser

from vit.errors import did_you_mean, find_user_error


class VitArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, whose errors are a few lines naming the key and the fix, not the usage and a dump
    of jsonargparse's Union validation."""

    args: ClassVar[list[str]] = []  # the command line last parsed, for naming the config file a bad key came from
    # In the parser jsonargparse makes for one class's arguments: the class's reader of its old spellings
    # (``ImageClassifier.old_spellings``: ``finetune: lora``, ``mean``, ...), applied before they are checked.
    old_spellings: Callable[[dict[str, Any]], tuple[dict[str, Any], list[str]]] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No prefix matching, in the parsers jsonargparse makes for a class's arguments too (of this type): argparse
        # would take --model.init_args.optim.warmup_epoch for optim.warmup_epochs, silently.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def add_class_arguments(self, theclass: Any, nested_key: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if nested_key is None:  # the parser of one class's arguments
            self.old_spellings = getattr(theclass, "old_spellings", None)
        return super().add_class_arguments(theclass, nested_key, *args, **kwargs)

    def parse_object(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        """A config's (or a checkpoint's) arguments of the class, old spellings read the new way, one line each."""
        if self.old_spellings is not None and isinstance(obj, dict | Namespace):
            obj, notes = self.old_spellings(obj.as_dict() if isinstance(obj, Namespace) else obj)
            warn_each(notes)
        return super().parse_object(obj, *args, **kwargs)

    def parse_args(self, args: Any = None, *more: Any, **kwargs: Any) -> Any:
        VitArgumentParser.args = list(sys.argv[1:] if args is None else args)
        if self.old_spellings is not None:  # a command-line key inside the class's arguments
            VitArgumentParser.args = old_options(VitArgumentParser.args, self.old_spellings)
        return super().parse_args(nested_nulls(VitArgumentParser.args), *more, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # a parser used internally, whose caller handles the error
            super().error(message, ex)
        user_error = find_user_error(ex) if ex is not None else None
        command = "vit " + self.prog.split()[-1] if self.prog.split()[-1] != "vit" else "vit"
        text = str(user_error) if user_error is not None else short_parse_error(message)
        unknown = re.match(r"unrecognized arguments: (--[^\s=]+)", message)
        if unknown:
            options = [o for action in self._actions for o in action.option_strings]
            text += did_you_mean(unknown.group(1), options)
        # A key in a config file the subcommand lacks: jsonargparse's root parser says so under its own name
        # ("vit"), without a suggestion or the file.
        misplaced = re.match(r"Subcommand '([^']+)' does not accept option '([^']+)'", message)
        subparser = getattr(ex, "subcommand_parser", None)
        if misplaced and subparser is not None:
            command, key = f"vit {misplaced.group(1)}", misplaced.group(2)
            keys = [a.dest for a in subparser._actions if a.dest and a.dest != "help"]
            files = [f for f in config_files(VitArgumentParser.args) if has_key(f, key)]
            text = f"{', '.join(files) + ': ' if files else ''}no option {key!r}{did_you_mean(key, keys)}"
        sys.stderr.write(f"{command}: error: {text}\n(`{command} --help` lists the options)\n")
        raise SystemExit(2)


def old_options(args: list[str], read: Callable[[dict[str, Any]], tuple[dict[str, Any], list[str]]]) -> list[str]:
    """``--key=value`` options of a class's arguments (``--finetune=lora``, ``--lora.rank=4``, ``--head_epochs=1``)
    with the old spellings ``read`` knows written the new way (one line each); any other form as it is."""
    import yaml

    given: dict[str, Any] = {}
    for arg in args:
        option = re.fullmatch(r"--([\w.]+)=(.*)", arg, re.S)
        if option is None:
            return args
        key, value = option.group(1), yaml.safe_load(option.group(2))
        root, _, rest = key.partition(".")
        given[root] = {**(given.get(root) or {}), rest: value} if rest else value
    upgraded, notes = read(given)
    if not notes:
        return args
    warn_each(notes)
    out = []
    for key, value in upgraded.items():
        if isinstance(value, dict) and "class_path" not in value and "init_args" in value:  # onto the class given
            out += [f"--{key}.init_args.{k}={json.dumps(v)}" for k, v in value["init_args"].items()]
        else:
            out.append(f"--{key}={value if isinstance(value, str) else json.dumps(value)}")
    return out


def warn_each(notes: list[str]) -> None:
    """One line for each old spelling met (a FutureWarning, shown once)."""
    for note in notes:
        warnings.warn(note, FutureWarning, stacklevel=2)


def nested_nulls(args: list[str]) -> list[str]:
    """``args`` with each null given to a key two levels inside a class's arguments (``--model.init_args.optim.ema_decay
    null``) written as the mapping it sets (``--model.init_args={optim: {ema_decay: null}}``), which jsonargparse
    merges as it should: the dotted form it re-reads as the string "None", which no ``float | None`` takes
    (jsonargparse 4.53)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg, given = args[i], None
        nested = re.fullmatch(r"(--[\w.]*init_args)\.(\w+(?:\.\w+)+)(=null)?", arg)
        if nested and nested.group(3):
            given = 1
        elif nested and i + 1 < len(args) and args[i + 1] == "null":
            given = 2
        if given is None:
            out.append(arg)
            i += 1
            continue
        keys = nested.group(2).split(".")  # type: ignore[union-attr]
        out.append(f"{nested.group(1)}=" + "".join(f"{{{k}: " for k in keys) + "null" + "}" * len(keys))  # type: ignore[union-attr]
        i += given
    return out


def config_files(args: list[str]) -> list[str]:
    """The files given to ``--config``/``-c`` in ``args``."""
    found = [b for a, b in itertools.pairwise(args) if a in ("--config", "-c")]
    return found + [a.split("=", 1)[1] for a in args if a.startswith("--config=")]


def has_key(path: str, dotted: str) -> bool:
    """Whether the YAML file ``path`` sets the nested key ``dotted`` (``trainer.max_epochs``)."""
    import yaml

    try:
        node: Any = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def short_parse_error(message: str) -> str:
    """The cause in a jsonargparse error: the key, the bad value or option, and the nearest valid name."""
    key = re.match(r'Parser key "([^"]+)":\s*(.*)', message, re.S)
    if key is None:
        return message.strip().splitlines()[0]
    name, rest = key.group(1), key.group(2).strip()
    problems = re.findall(r"Problem with given class_path '([^']+)':\s*\n\s*(.+)", rest)
    if problems:  # the innermost class's (a head inside the model: model.init_args.head)
        nested = re.findall(r'Parser key "([^"]+)"', rest.split("Problem with given class_path", 1)[1])
        where = name + "".join(f".init_args.{k}" for k in nested)
        return class_problem(where, problems[-1][0], problems[-1][1].strip())
    if "Union subtypes" not in rest:
        return f"{name}: {rest}"
    errors = [line.strip()[2:] for line in rest.splitlines()
              if line.strip().startswith("- ") and "<class 'NoneType'>" not in line]
    given = re.search(r"Given value: (.*)", rest)
    value = f" {given.group(1)[:80]!r}" if given else ""
    return f"{name}: invalid value{value}: " + "; ".join(e.replace("Expected a <class '", "expected ")
                                                          .replace("'>", "") for e in errors)


def class_problem(name: str, class_path: str, reason: str) -> str:
    """What is wrong with the class ``class_path`` at key ``name``: an option it lacks (moved, or misspelt: the
    nearest of its options, a settings group's fields included), a class that does not exist, or ``reason``."""
    option = re.match(r"Option '([^']+)' is not accepted", reason) or re.match(
        r'Key "([^"]+)" is not expected', reason) or re.match(r"unrecognized arguments: --([^=\s]+)", reason)
    group = re.match(r"Group '([^']+)' does not accept option '([^']+)'", reason)
    if group:
        option_name = f"{group.group(1)}.{group.group(2)}"
    elif option:
        option_name = option.group(1)
    else:
        missing = re.match(r"module '([^']+)' has no attribute '([^']+)'", reason)
        if missing:
            module = importlib.import_module(missing.group(1))
            hint = did_you_mean(missing.group(2), [n for n in dir(module) if n[:1].isupper()])
            return f"{name}: no class {missing.group(2)!r} in {missing.group(1)}{hint}"
        return f"{name}: {class_path}: {reason}"
    moved = moved_options(name, class_path, option_name, VitArgumentParser.args)
    if moved:
        return moved
    hint = did_you_mean(option_name, accepted_arguments(class_path))
    return f"{name}: {class_path} has no option {option_name!r}{hint}"


def moved_options(name: str, class_path: str, option: str, args: list[str]) -> str | None:
    """Where ``option``, an argument of an older ``class_path``, lives now (the class's ``moved`` table), with every
    other moved option the command line and its config files give; None if the class never had it."""
    moved: dict[str, str] = getattr(imported_class(class_path), "moved", {})
    if option not in moved:
        return None
    given = {a.split("=", 1)[0].removeprefix(f"--{name}.init_args.") for a in args
             if a.startswith(f"--{name}.init_args.")}
    files = config_files(args)
    for file in files:
        given |= set(yaml_keys(file, f"{name}.init_args"))
    old = sorted({option, *(k for k in given if k in moved)})
    places: dict[str, list[str]] = {}
    for key in old:  # by where they went: optim.lr and optim.min_lr to "optim"
        places.setdefault(moved[key].rsplit(".", 1)[0] if "." in moved[key] and ":" not in moved[key]
                          else moved[key], []).append(key)
    lines = [moved_line(name, place, keys) for place, keys in places.items()]
    where = [f for f in files if any(has_key(f, f"{name}.init_args.{k}") for k in old)]
    head = f"{', '.join(where)}: " if where else ""
    return head + f"{class_path} takes {'this option' if len(old) == 1 else 'these options'} elsewhere now:\n  " + \
        "\n  ".join(lines)


def moved_line(name: str, place: str, keys: list[str]) -> str:
    """``model.init_args.lr moved: use model.init_args.optim.lr``, braced for several keys; or the class they
    belong to (``class_path: ...``)."""
    listed = keys[0] if len(keys) == 1 else "{" + ", ".join(keys) + "}"
    if place.startswith("class_path:"):
        return f"{name}.init_args.{listed}: options of {name}.{place.replace(':', ' =', 1)}"
    return f"{name}.init_args.{listed} moved: use {name}.init_args.{place}.{listed}"


def yaml_keys(path: str, dotted: str) -> list[str]:
    """The keys of the mapping at ``dotted`` (``model.init_args``) in the YAML file ``path``, if any."""
    import yaml

    try:
        node: Any = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return []
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return list(node) if isinstance(node, dict) else []


def imported_class(class_path: str) -> type | None:
    """The class ``class_path`` names, or None if it does not import."""
    module, _, name = class_path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if isinstance(found, type) else None


def accepted_arguments(class_path: str) -> list[str]:
    """The init arguments of a class, following ``**kwargs`` into its bases as jsonargparse does."""
    cls = imported_class(class_path)
    if cls is None:
        return []
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())[1:]
        names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for p in params:  # a settings group's fields: optim.lr
            if dataclasses.is_dataclass(p.default) and not isinstance(p.default, type):
                names += [f"{p.name}.{f.name}" for f in dataclasses.fields(p.default)]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names
