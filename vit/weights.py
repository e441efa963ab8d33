"""The old path of `vit.checkpoints.weights` and `vit.checkpoints.convert`.

It works, with a DeprecationWarning, until the next release.
"""

from vit._moved import forward

__getattr__ = forward(__name__, [
    "vit.checkpoints.weights",
    "vit.checkpoints.convert",
])
