"""The `vit` command: LightningCLI's fit/validate/test/predict, plus a few helper commands."""

from __future__ import annotations

import importlib
import sys

# Commands outside LightningCLI, as "module:function" taking argv; imported only when used,
# so `vit --help` stays fast.
COMMANDS: dict[str, str] = {}


def main(args: list[str] | None = None) -> None:
    """Entry point of the `vit` console script."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] in COMMANDS:
        module, function = COMMANDS[argv[0]].split(":")
        getattr(importlib.import_module(module), function)(argv[1:])
        return
    from lightning.pytorch.cli import LightningCLI

    LightningCLI(args=argv)


if __name__ == "__main__":
    main()
