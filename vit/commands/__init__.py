"""The `vit` console script: one table of commands, each imported only when it runs.

``vit fit|validate|test|predict --config ...`` are LightningCLI's (`vit.cli.main`); the others are plain
argparse commands in this package that import no Lightning, so ``vit predict --ckpt ...`` and
``vit --help`` start quickly. One module a command (its logic lives in the package it concerns):

    predict.py  calibrate.py  export.py  serve.py  attention.py (with faithfulness.py and text_attention.py, its
    --faithfulness and --text modes)  zeroshot.py  probe.py  shard.py  audit.py  translate.py  average.py  select.py
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from vit.errors import TRACEBACK_ENV, find_user_error, want_traceback

# name -> (module whose main(argv) runs it, one line for `vit --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "fit": ("vit.cli.main", "train from a YAML recipe (configs/), then test the best checkpoint"),
    "pretrain": ("vit.cli.main", "MAE pre-training on unlabelled images: vit pretrain --config configs/pretrain/..."),
    "validate": ("vit.cli.main", "evaluate a checkpoint on the validation split"),
    "test": ("vit.cli.main", "evaluate a checkpoint on the test split"),
    "predict": ("vit.commands.predict", "classify image files: vit predict --ckpt CKPT|MODEL.onnx IMAGES..."),
    "calibrate": ("vit.commands.calibrate", "calibrated probabilities and an 'unknown' answer: vit calibrate "
                  "--ckpt CKPT --config CFG"),
    "export": ("vit.commands.export", "write a checkpoint as ONNX, timm safetensors or one .ckpt: vit export ..."),
    "serve": ("vit.commands.serve", "serve a checkpoint or ONNX model over HTTP, with a page: vit serve --ckpt CKPT"),
    "attention": ("vit.commands.attention", "attention maps and top classes of images; --text: a translation's; "
                  "--faithfulness: check the maps"),
    "zeroshot": ("vit.commands.zeroshot", "a classifier from class names with CLIP/SigLIP: vit zeroshot --model M "
                 "--classes \"a,b\" --out DIR"),
    "probe": ("vit.commands.probe", "linear-probe and kNN baseline on frozen features: vit probe --config CFG"),
    "shard": ("vit.commands.shard", "write an image folder as streaming shards: vit shard SRC OUT [--max_side 320]"),
    "audit": ("vit.commands.audit", "check a dataset: leakage, duplicates, label issues, skew: vit audit --config CFG"),
    "translate": ("vit.commands.translate", "translate sentences with a Translator checkpoint"),
    "select": ("vit.commands.select", "choose which images to label next: vit select --from POOL --budget N --out "
               "to_label.csv (--model M --pretrained W | --ckpt CKPT)"),
    "average": ("vit.commands.average", "average classifier checkpoints' weights (WiSE-FT, soups): vit average "
                "--ckpt A --ckpt B --alpha 0.5 --out C"),
}


def version() -> str:
    """`vit --version`: this package's version, and torch's and Lightning's (what a bug report needs)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    import vit

    def of(name: str) -> str:
        try:
            return installed(name)
        except PackageNotFoundError:
            return "not installed"

    return f"vit {vit.__version__} (torch {of('torch')}, lightning {of('lightning')}, timm {of('timm')})"


def usage() -> str:
    """`vit --help`: every command with a line each."""
    width = max(map(len, COMMANDS))
    lines = ["usage: vit COMMAND [options]   (vit COMMAND --help for a command's options; vit --version)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "vit predict --config CFG (no --ckpt) runs LightningCLI's predict over the recipe's data.",
              "--traceback (or VIT_TRACEBACK=1) after any command shows the full traceback of an error."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: run ``vit`` with ``argv`` (default: the command line). Returns nothing, since
    a console script's return value becomes its exit status.

    A mistake the user can fix (a `vit.errors.UserError`, also when a config parser wrapped it) prints
    ``vit <command>: error: ...`` and exits 1; any other exception is a bug and shows its traceback.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    traceback = "--traceback" in args or want_traceback()
    if "--traceback" in args:
        args.remove("--traceback")
    if argv is None:  # LightningCLI reads sys.argv itself: leave it without --traceback
        sys.argv[1:] = args
        if traceback:  # DDP re-runs this command line in new processes: they learn it from the environment
            os.environ[TRACEBACK_ENV] = "1"
    command = f"vit {args[0]}" if args and args[0] in COMMANDS else "vit"
    try:
        with short_warnings(command):
            run(None if argv is None else args)
    except Exception as e:
        user_error = None if traceback else find_user_error(e)
        if user_error is None:
            raise
        # The message alone, ending with its own advice (`vit --help` names --traceback, for bug reports).
        print(f"{command}: error: {user_message(user_error)}", file=sys.stderr)
        raise SystemExit(1) from None


PACKAGE = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def short_warnings(command: str) -> Iterator[None]:
    """Our own warnings as ``vit <command>: warning: ...``: they are written for a person, and Python's default
    format adds the file, line number and source line of the ``warnings.warn`` call. Other packages' warnings
    keep that format, which says where they come from."""
    default = warnings.formatwarning

    def formatwarning(message, category, filename, lineno, line=None):
        if Path(filename).resolve().is_relative_to(PACKAGE):
            return f"{command}: warning: {message}\n"
        return default(message, category, filename, lineno, line)

    warnings.formatwarning = formatwarning
    try:
        yield
    finally:
        warnings.formatwarning = default


def user_message(error: BaseException) -> str:
    """A user error's message, without the worker's traceback that a DataLoader worker's error carries.

    torch re-raises a worker's exception in the main process as ``type(e)("Caught ... Original Traceback
    ...")``: the traceback text becomes the message, and ends with ``module.Type: <the message>``."""
    text = str(error)
    if "\nOriginal Traceback (most recent call last):" not in text:
        return text
    kind = type(error)
    for name in (f"{kind.__module__}.{kind.__qualname__}: ", f"{kind.__qualname__}: "):
        at = text.rfind("\n" + name)
        if at >= 0:
            return text[at + 1 + len(name):].strip()
    return text.strip().splitlines()[-1]


def run(argv: Sequence[str] | None = None) -> object:
    """Run one `vit` command and return what it returns (predictions, the CLI object, ...).

    ``argv`` defaults to the command line."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return None
    if args[0] in ("-V", "--version"):
        print(version())
        return None
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"vit: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        raise SystemExit(2)
    module = COMMANDS[name][0]
    if name == "predict" and not any(a == "--ckpt" or a.startswith("--ckpt=") for a in rest) and (
        any(a.startswith("--config") for a in rest)
    ):
        module = "vit.cli.main"  # predict over a DataModule: LightningCLI's
    if module == "vit.cli.main" or name == "probe":
        from vit.cli.preflight import check_pretrained

        check_pretrained(rest)  # weights that cannot be had fail here, not after importing Lightning
    if module == "vit.cli.main":
        # from the command line LightningCLI reads sys.argv itself (given both, it warns that they may differ)
        return importlib.import_module(module).cli(None if argv is None else args)
    return importlib.import_module(module).main(rest)


if __name__ == "__main__":
    main()
