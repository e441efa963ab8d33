"""The `vit` console script: one table of commands, each imported only when it runs.

``vit fit|validate|test|predict --config ...`` are LightningCLI's (`vit.cli`); the others are plain
argparse commands in this package that import no Lightning, so ``vit predict --ckpt ...`` and
``vit --help`` start quickly.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# name -> (module whose main(argv) runs it, one line for `vit --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "fit": ("vit.cli", "train from a YAML recipe (configs/), then test the best checkpoint"),
    "validate": ("vit.cli", "evaluate a checkpoint on the validation split"),
    "test": ("vit.cli", "evaluate a checkpoint on the test split"),
    "predict": ("vit.commands.predict", "classify image files: vit predict --ckpt CKPT|MODEL.onnx IMAGES..."),
    "export": ("vit.commands.export", "write a checkpoint as ONNX or timm safetensors: vit export --ckpt CKPT ..."),
    "attention": ("vit.commands.attention", "draw attention maps and the top classes of image files"),
    "probe": ("vit.commands.probe", "linear-probe and kNN baseline on frozen features: vit probe --config CFG"),
    "translate": ("vit.commands.translate", "translate sentences with a Translator checkpoint"),
}


def usage() -> str:
    """`vit --help`: every command with a line each."""
    width = max(map(len, COMMANDS))
    lines = ["usage: vit COMMAND [options]   (vit COMMAND --help for a command's options)", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "vit predict --config CFG (no --ckpt) runs LightningCLI's predict over the recipe's data."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """The console script: run ``vit`` with ``argv`` (default: the command line). Returns nothing, since
    a console script's return value becomes its exit status."""
    run(argv)


def run(argv: Sequence[str] | None = None) -> object:
    """Run one `vit` command and return what it returns (predictions, the CLI object, ...).

    ``argv`` defaults to the command line."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return None
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"vit: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        raise SystemExit(2)
    module = COMMANDS[name][0]
    if name == "predict" and not any(a == "--ckpt" or a.startswith("--ckpt=") for a in rest) and (
        any(a.startswith("--config") for a in rest)
    ):
        module = "vit.cli"  # predict over a DataModule: LightningCLI's
    if module == "vit.cli":
        # from the command line LightningCLI reads sys.argv itself (given both, it warns that they may differ)
        return importlib.import_module(module).cli(None if argv is None else args)
    return importlib.import_module(module).main(rest)


if __name__ == "__main__":
    main()
