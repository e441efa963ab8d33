"""A labelled folder's images by class name; a sub-folder naming no class is an error."""

import pytest
import torch
from PIL import Image

from vit.deploy.zeroshot import FolderScore, labelled_images, score_folder
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


class _AlwaysFirst(torch.nn.Module):
    """A stub classifier that answers class 0 on every image."""

    class_names = ("cat", "dog")
    image_mode = "RGB"
    device = torch.device("cpu")

    def eval_transform(self):
        return lambda image: torch.zeros(3, 4, 4)

    def forward(self, images):
        return torch.tensor([[1.0, 0.0]]).expand(len(images), 2)


def test_score_folder_counts_rows_as_truth_and_columns_as_guess(tmp_path):
    (tmp_path / "dog").mkdir()
    for i in range(2):
        Image.new("RGB", (4, 4)).save(tmp_path / "dog" / f"{i}.png")
    score = score_folder(_AlwaysFirst(), tmp_path)
    # two dogs (row 1) both called cat (column 0); a transposed matrix would say [[0, 2], [0, 0]]
    assert score.confusion.tolist() == [[0, 0], [2, 0]]
    assert score.top1 == 0.0 and score.count == 2
