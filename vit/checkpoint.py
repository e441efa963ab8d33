"""The old path of `vit.checkpoints.io`, `vit.checkpoints.meta`, `vit.checkpoints.runs` and `vit.deploy`.

It works, with a DeprecationWarning, until the next release.
"""

from vit._moved import forward

__getattr__ = forward(__name__, [
    "vit.checkpoints.io",
    "vit.checkpoints.meta",
    "vit.checkpoints.runs",
    "vit.deploy.classifier",
    "vit.deploy.backends",
])
