"""The old path of `vit.cli.training`.

It works, with a DeprecationWarning, until the next release.
"""

from vit._moved import forward

__getattr__ = forward(__name__, [
    "vit.cli.training",
])
