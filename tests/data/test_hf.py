"""Finding Hugging Face data (vit.data.hf): save_to_disk folders, the Hub's Parquet layout, and hf:// in the Hub cache
at a branch, a tag or a commit."""

from __future__ import annotations

import pytest

from tests.data.hf_formats import COMMIT, dataset, digits, write_hub_cache, write_parquet
from vit.data.hf import find_source, hub_snapshot, is_hf_root
from vit.errors import UserError

pytest.importorskip("datasets")
NAMES = [str(i) for i in range(10)]


def test_the_three_layouts_are_told_from_class_folders_and_tables(tmp_path):
    images, labels = digits(1)
    ds = dataset(images, labels, NAMES)
    ds.save_to_disk(str(tmp_path / "one"))
    from datasets import DatasetDict

    DatasetDict({"train": ds, "validation": ds, "test": ds}).save_to_disk(str(tmp_path / "dict"))
    write_parquet(tmp_path / "pq", {"train": ds, "valid": ds})
    (tmp_path / "folder" / "cat").mkdir(parents=True)
    assert all(is_hf_root(tmp_path / n) for n in ("one", "dict", "pq")) and is_hf_root("hf://a/b")
    assert not is_hf_root(tmp_path / "folder") and not is_hf_root(tmp_path / "missing")
    assert list(find_source(str(tmp_path / "one")).splits) == ["train"]
    source = find_source(str(tmp_path / "dict"))
    assert source.kind == "save_to_disk" and list(source.splits) == ["train", "val", "test"]
    assert source.features["label"]["names"] == NAMES and source.fingerprint.count("+") == 2
    source = find_source(str(tmp_path / "pq"))
    assert source.kind == "parquet" and sorted(source.splits) == ["train", "val"]
    assert [f.name for f in source.splits["val"]] == ["valid-00000-of-00001.parquet"]


def test_hf_names_resolve_in_the_cache_by_branch_and_commit_and_a_missing_revision_is_one_line(tmp_path,
                                                                                              monkeypatch):
    images, labels = digits(1)
    snapshot = write_hub_cache(tmp_path / "home", "org/digits", {"train": dataset(images, labels, NAMES)})
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for spec in ("hf://org/digits", "hf://org/digits@main", f"hf://org/digits@{COMMIT}", "hf://datasets/org/digits"):
        assert hub_snapshot(spec) == (snapshot, "org/digits", COMMIT), spec
    source = find_source("hf://org/digits")
    assert (source.name, source.revision) == ("org/digits", COMMIT)
    with pytest.raises(UserError) as e:
        hub_snapshot("hf://org/digits@v9")
    assert len(str(e.value).splitlines()) == 1 and "--revision v9" in str(e.value)
    with pytest.raises(UserError, match="expected hf://owner/name"):
        hub_snapshot("hf://a/b/c")
