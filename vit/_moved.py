"""Old import paths that still work for one release: each warns, naming the module a name now lives in.

The flat modules of 0.1 (`vit.checkpoint`, `vit.inference`, `vit.backends`, ...) moved into packages by concern
(`vit.deploy`, `vit.checkpoints`, `vit.cli`). Users' notebooks import the old paths; those modules are now
`forward(...)` stubs. Imports nothing of `vit` at import time, so the stubs add no edge to the import graph.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any


def forward(old: str, new: Sequence[str], stacklevel: int = 2) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old``: a name is looked up in the ``new`` modules, with a DeprecationWarning
    that says where to import it from (the module that defines it, where another one only imports it)."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        having = [m for m in new if hasattr(importlib.import_module(m), name)]
        home = [m for m in having if getattr(getattr(importlib.import_module(m), name), "__module__", m) == m]
        if not having:
            raise AttributeError(f"module {old!r} has no attribute {name!r} (it moved to {', '.join(new)})")
        module = (home or having)[0]
        warnings.warn(f"{old}.{name} moved to {module}.{name}: import it from {module} (the old path {old} goes in "
                      "the next release)", DeprecationWarning, stacklevel=stacklevel)
        return getattr(importlib.import_module(module), name)

    return __getattr__
