"""A labelled folder's images by class name; a sub-folder naming no class is an error; an unreadable file is
reported and left out of the score."""

from pathlib import Path

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


class Brightness(torch.nn.Module):
    """A two-class stand-in for a `vit.deploy.Classifier`: dark images are "cat", bright ones "dog"."""

    class_names, image_mode, device = ["cat", "dog"], "RGB", torch.device("cpu")

    def eval_transform(self):
        return lambda image: torch.tensor(list(image.getdata()), dtype=torch.float32).T.reshape(3, 4, 4) / 255

    def eval_short_side(self):
        return 4

    def forward(self, x):
        bright = x.mean(dim=(1, 2, 3))
        return torch.stack([1 - bright, bright], dim=-1)


def test_an_unreadable_file_in_the_eval_folder_is_reported_not_a_crash(tmp_path):
    for name, shade in (("cat", 0), ("dog", 255)):
        (tmp_path / name).mkdir()
        Image.new("RGB", (4, 4), (shade,) * 3).save(tmp_path / name / "a.png")
    (tmp_path / "dog" / "b.png").write_text("not an image")
    (tmp_path / "dog" / "c.png").write_bytes(b"")
    score = score_folder(Brightness(), tmp_path, batch_size=2)
    assert score.count == 2 and score.top1 == 1.0 and score.confusion.tolist() == [[1, 0], [0, 1]]
    assert [(Path(p).name, why) for p, why in score.unreadable] == [
        ("b.png", "not an image in a format PIL reads"), ("c.png", "empty file (0 bytes)")]
    for name in ("a.png",):
        (tmp_path / "cat" / name).write_text("broken too")
        (tmp_path / "dog" / name).write_text("broken too")
    with pytest.raises(UserValueError, match=r"none of its 4 images could be read \(first: .*a\.png: not an image"):
        score_folder(Brightness(), tmp_path)


class _AlwaysFirst(torch.nn.Module):
    """A stub classifier that answers class 0 on every image."""

    class_names = ("cat", "dog")
    image_mode = "RGB"
    device = torch.device("cpu")

    def eval_transform(self):
        return lambda image: torch.zeros(3, 4, 4)

    def eval_short_side(self):
        return 4

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
