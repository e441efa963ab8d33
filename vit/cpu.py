"""The old path of `vit.deploy.cpu`.

It works, with a DeprecationWarning, until the next release.
"""

from vit._moved import forward

__getattr__ = forward(__name__, [
    "vit.deploy.cpu",
])
