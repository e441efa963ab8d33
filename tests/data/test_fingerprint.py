"""A dataset's fingerprint (`vit.data.fingerprint`): it follows the files' paths, labels and modification."""

from __future__ import annotations

import hashlib
import os

import numpy as np
from PIL import Image

from vit.data.files import ImageFiles
from vit.data.fingerprint import files_fingerprint, fingerprint


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


def test_fingerprint_is_sha256_of_its_values_in_order():
    assert fingerprint() == hashlib.sha256().hexdigest()  # nothing fed: the empty input's digest
    assert len(fingerprint(1)) == 64 and fingerprint(1, 2) == fingerprint(1, 2)
    assert fingerprint(1, 2) != fingerprint(2, 1) and fingerprint("a") != fingerprint("a", "a")


def test_files_fingerprint_follows_path_label_size_and_time_not_the_spelling(tmp_path, monkeypatch):
    file = tmp_path / "a.png"
    file.write_bytes(b"12345")
    os.utime(file, ns=(10**18, 10**18))
    key = files_fingerprint("folder", "T", [(str(file), 0)])
    monkeypatch.chdir(tmp_path)
    assert files_fingerprint("folder", "T", [("a.png", 0)]) == key  # the resolved path
    assert files_fingerprint("folder", "T", [(str(file), 1)]) != key
    assert files_fingerprint("folder", "U", [(str(file), 0)]) != key
    file.write_bytes(b"12346")  # same size: its time changed
    assert files_fingerprint("folder", "T", [(str(file), 0)]) != key
    os.utime(file, ns=(10**18, 10**18))
    assert files_fingerprint("folder", "T", [(str(file), 0)]) == key  # same size and time: the contents unread
