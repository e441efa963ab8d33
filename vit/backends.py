"""The old path of `vit.deploy.backends`.

It works, with a DeprecationWarning, until the next release.
"""

from vit._moved import forward

__getattr__ = forward(__name__, [
    "vit.deploy.backends",
])
