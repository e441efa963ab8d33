"""A labels CSV saved by Excel on Windows (UTF-8 with a byte-order mark, CRLF line ends, ``img\\0001.png`` paths,
capitalised headers) reads as its Unix twin does (vit.data.rows, and LabelsFile on it)."""

from __future__ import annotations

from tests.helpers import random_images
from vit.data.rows import read_table
from vit.data.table import LabelsFile

LABELS = ["cat", "dog", "owl"] * 4


def write_twins(root):
    random_images(root / "img", len(LABELS), mode="RGB", name="{i:04d}.png")
    unix = "file_name,label\n" + "".join(f"img/{i:04d}.png,{c}\n" for i, c in enumerate(LABELS))
    windows = "File_Name,Label\r\n" + "".join(f"img\\{i:04d}.png,{c}\r\n" for i, c in enumerate(LABELS))
    (root / "unix.csv").write_bytes(unix.encode())
    (root / "windows.csv").write_bytes(b"\xef\xbb\xbf" + windows.encode())  # Excel's "CSV UTF-8"
    return root / "unix.csv", root / "windows.csv"


def test_an_excel_csv_from_windows_reads_as_its_unix_twin(tmp_path):
    unix, windows = write_twins(tmp_path)
    a, b = read_table(unix), read_table(windows)
    assert not a.bad and not b.bad and len(a.paths) == len(LABELS)
    assert (b.paths, b.labels, b.class_names) == (a.paths, a.labels, a.class_names)
    assert all("\\" not in p for p in b.paths) and b.class_names == ["cat", "dog", "owl"]
    opts = dict(img_size=8, batch_size=4, num_workers=0, val_fraction=0.25, test_fraction=0.25)
    data_unix, data_windows = LabelsFile(str(unix), **opts), LabelsFile(str(windows), **opts)
    data_unix.setup("fit")
    data_windows.setup("fit")
    for split in ("train", "val", "test"):
        assert getattr(data_windows, f"{split}_set").samples == getattr(data_unix, f"{split}_set").samples
