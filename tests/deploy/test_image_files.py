"""Reading image files for prediction (`vit.deploy.image_files`): a file that cannot be decoded costs its row, not the
batch, and the closing summary names every such file up to the shown limit."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

from vit.deploy.image_files import (
    ImagePaths,
    Unreadable,
    UnreadableImageError,
    check_some_readable,
    collate_readable,
    describe_run,
)


def test_an_unreadable_file_is_set_apart_and_the_readable_ones_are_stacked_in_order(tmp_path):
    good = [tmp_path / f"{i}.png" for i in range(2)]
    for i, path in enumerate(good):
        Image.new("L", (4, 4), 50 * (i + 1)).save(path)
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    missing = tmp_path / "gone.png"
    files = ImagePaths([good[0], text, good[1], missing], pil_to_tensor, mode="L")
    items = [files[i] for i in range(len(files))]
    assert [i for i, _ in items] == [0, 1, 2, 3]
    assert isinstance(items[1][1], Unreadable) and isinstance(items[3][1], Unreadable)
    assert items[3][1].reason == "No such file or directory"
    batch = collate_readable(items)
    assert batch.indices == [0, 2] and [i for i, _ in batch.failed] == [1, 3]
    assert torch.equal(batch.images[:, 0, 0, 0], torch.tensor([50, 100], dtype=torch.uint8))
    assert collate_readable([items[1]]).images is None  # no image in the batch: no tensor, the failure kept


def rows(n_good: int, n_bad: int) -> list[dict]:
    return ([{"path": f"g{i}.png", "error": None} for i in range(n_good)]
            + [{"path": f"b{i}.png", "error": "truncated"} for i in range(n_bad)])


def test_the_summary_lists_the_first_ten_unreadable_files_and_counts_the_rest(tmp_path):
    assert describe_run("wrote p.csv", rows(3, 0), tmp_path / "p.csv") == "wrote p.csv"
    one = describe_run("wrote p.json", rows(3, 1), tmp_path / "p.json").splitlines()
    assert one[0].endswith("1 file could not be read (the reason is in the error field of " f"{tmp_path / 'p.json'}):")
    assert one[1:] == ["  b0.png: truncated"]
    ten = describe_run("wrote p.csv", rows(0, 10), tmp_path / "p.csv").splitlines()
    assert "10 files could not be read" in ten[0] and "error column" in ten[0] and len(ten) == 11
    eleven = describe_run("wrote p.csv", rows(0, 11), tmp_path / "p.csv").splitlines()
    assert len(eleven) == 12 and eleven[-1] == "  ... and 1 more" and eleven[-2] == "  b9.png: truncated"


def test_only_a_run_where_no_file_could_be_read_is_an_error():
    check_some_readable([])
    check_some_readable(rows(1, 5))
    with pytest.raises(UnreadableImageError, match="none of the 1 image file could be read"):
        check_some_readable(rows(0, 1))
    with pytest.raises(UnreadableImageError, match="none of the 2 image files could be read"):
        check_some_readable(rows(0, 2))
