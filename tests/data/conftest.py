"""What the shard tests share: the image modes of the folder `sharded` (tests/conftest.py) writes, and the options
they read it with."""

from __future__ import annotations

# Every common mode, sizes around the 16 px the model sees, and one truncated file.
MODES = ("RGB", "L", "P", "RGBA", "CMYK", "I;16")
OPTS = dict(img_size=16, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, interpolation="bicubic", seed=0)
