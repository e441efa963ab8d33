"""A dataset's fingerprint (`vit.data.fingerprint`): it follows the files' paths, labels and modification."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image

from vit.data.folder import ImageFiles


def test_file_fingerprint_follows_paths_labels_and_modification(tmp_path):
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"{i}.png"))
        Image.fromarray(np.full((4, 4), 40 * i, np.uint8)).save(paths[-1])
    files = ImageFiles([(p, i % 2) for i, p in enumerate(paths)])
    key = files.fingerprint()
    assert ImageFiles([(p, i % 2) for i, p in enumerate(paths)]).fingerprint() == key
    assert ImageFiles([(p, 1) for p in paths]).fingerprint() != key  # labels
    assert ImageFiles([(p, i % 2) for i, p in enumerate(paths[:2])]).fingerprint() != key  # files
    os.utime(paths[0], ns=(0, 10**9))
    assert files.fingerprint() != key  # a rewritten file
    assert files.item_name(2) == paths[2]
    raw = files.raw_image(2)
    assert raw.mode == "L" and raw.format == "PNG" and np.asarray(raw)[0, 0] == 80
