"""The old path of `vit.deploy.inference`, `vit.deploy.metadata` and `vit.deploy.backends`.

It works, with a DeprecationWarning, until the next release.
"""

from vit._moved import forward

__getattr__ = forward(__name__, [
    "vit.deploy.inference",
    "vit.deploy.metadata",
    "vit.deploy.backends",
])
