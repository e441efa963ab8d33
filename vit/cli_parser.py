"""The old path of `vit.cli.parser`.

It works, with a DeprecationWarning, until the next release.
"""

from vit._moved import forward

__getattr__ = forward(__name__, [
    "vit.cli.parser",
])
