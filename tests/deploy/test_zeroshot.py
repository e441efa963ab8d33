"""A labelled folder's images by class name; a sub-folder naming no class is an error."""

import pytest
import torch
from PIL import Image

from vit.deploy.zeroshot import FolderScore, labelled_images
from vit.errors import UserValueError


def test_labelled_images_and_the_table(tmp_path):
    for name in ("dog", "cat"):
        (tmp_path / name).mkdir()
        Image.new("RGB", (4, 4)).save(tmp_path / name / "a.png")
    found = labelled_images(tmp_path, ["cat", "dog"])
    assert [(p.parent.name, i) for p, i in found] == [("cat", 0), ("dog", 1)]
    with pytest.raises(UserValueError, match="'dog' is not one of the classes"):
        labelled_images(tmp_path, ["cat", "bird"])
    table = FolderScore(0.5, 2, torch.tensor([[1, 0], [1, 0]]), ["cat", "dog"]).table().splitlines()
    assert table[1].split() == ["cat", "1", "0"] and table[2].split() == ["dog", "1", "0"]
