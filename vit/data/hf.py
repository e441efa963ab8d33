"""Hugging Face `datasets` data read without Lightning: a `save_to_disk` folder, Hub-layout Parquet, or ``hf://``.

```
root ─► find_source: save_to_disk folder (state.json / dataset_dict.json) ─┐   split -> Arrow files, memory-mapped
                     Parquet folder (data/train-*.parquet, ...)           ├─► or Parquet files, read once
                     hf://owner/name[@revision] -> the local Hub cache ───┘
     ─► read_hf: the image column (by type, or named) -> ArrowImageColumn: bytes per row from the Arrow buffers
                 the label column: ClassLabel (names from the feature), strings or ints (names sorted from the data),
                 Sequence(ClassLabel) or lists of strings (multi-label) -> a `LabelTable` whose paths are row numbers
```
Rows are read column by column with pyarrow: no Python dict per row, no temporary file. The `datasets` package is
not needed to read (only to write such data); pyarrow is (``pip install 'vit[hf]'``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vit.errors import UserPathError, UserValueError
from vit.network import unreachable

SPLIT_NAMES = {"train": "train", "validation": "val", "valid": "val", "val": "val", "test": "test"}
_SPLIT_IN_PATH = re.compile(r"(?:^|[/_.-])(train|validation|valid|val|test)(?:[/_.-]|$)")



@dataclass
class HFSource:
    """Where a dataset's splits are: the Arrow or Parquet files of each, and what names this version of it."""

    name: str  # owner/name for the Hub, else the folder's name
    folder: Path
    kind: str  # "save_to_disk" or "parquet"
    splits: dict[str, list[Path]]  # vit's split name (train / val / test) -> its files, in order
    revision: str | None = None  # the Hub commit, for hf://
    features: dict[str, Any] = field(default_factory=dict)  # datasets' Features as JSON, where the data says
    fingerprint: str = ""

    def provenance(self) -> dict[str, Any]:
        """What the run records and the model card names: the data's name, revision and fingerprint."""
        return {"name": self.name, "revision": self.revision, "fingerprint": self.fingerprint, "kind": self.kind}


def is_hf_root(root: str | os.PathLike) -> bool:
    """Whether ``root`` is Hugging Face data: hf://..., a save_to_disk folder, or a folder of Parquet files."""
    text = str(root)
    if text.startswith("hf://"):
        return True
    folder = Path(text).expanduser()
    if not folder.is_dir():
        return False
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        return True
    return any(folder.glob("*.parquet")) or any(folder.glob("data/*.parquet"))


def find_source(root: str) -> HFSource:
    """The `HFSource` of ``root`` (see `is_hf_root`); hf:// is read from the local Hub cache."""
    name, revision = None, None
    if root.startswith("hf://"):
        folder, name, revision = hub_snapshot(root)
    else:
        folder = Path(root).expanduser()
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        source = _saved_source(folder)
    else:
        source = _parquet_source(folder)
    source.name, source.revision = name or folder.name, revision
    files = [f for fs in source.splits.values() for f in fs]
    if not source.fingerprint:  # the files' names, sizes and times, as the folder path keys its files
        stats = [(str(f.relative_to(folder)), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        source.fingerprint = hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]
    return source


def hub_cache() -> Path:
    """The Hub's local cache, as huggingface_hub finds it: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/..."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def hub_snapshot(spec: str) -> tuple[Path, str, str]:
    """The cached snapshot folder of ``hf://owner/name[@revision]``, the repo id and the commit; downloaded when
    not cached and the Hub answers, else an error in one line saying what to run on a connected machine."""
    repo, _, revision = spec.removeprefix("hf://").removeprefix("datasets/").strip("/").partition("@")
    if repo.count("/") > 1 or not repo:
        raise UserValueError(f"{spec}: expected hf://owner/name or hf://owner/name@revision")
    revision = revision or "main"
    folder = hub_cache() / f"datasets--{repo.replace('/', '--')}"
    if snapshot := _cached(folder, revision):
        return snapshot, repo, snapshot.name
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    why = "HF_HUB_OFFLINE is set" if offline else unreachable("huggingface.co", 443, 5.0)
    if why is None:
        from huggingface_hub import snapshot_download

        snapshot = Path(snapshot_download(repo, repo_type="dataset", revision=revision, cache_dir=hub_cache()))
        return snapshot, repo, snapshot.name
    at = f" --revision {revision}" if revision != "main" else ""
    raise UserPathError(f"{spec} is not in the local Hub cache ({folder}) and cannot be downloaded ({why}): on a "
                        f"connected machine run `hf download {repo} --repo-type dataset{at}`, then copy its "
                        f"{hub_cache()} here (or point HF_HOME at it)")


def _cached(folder: Path, revision: str) -> Path | None:
    """The snapshot of ``revision`` (a branch or tag under refs/, or a commit) in a repo's cache folder, or None."""
    ref = folder / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = folder / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _saved_source(folder: Path) -> HFSource:
    """A `save_to_disk` folder: a DatasetDict (dataset_dict.json and one folder per split) or one Dataset."""
    if (folder / "dataset_dict.json").is_file():
        names = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        parts = {name: folder / name for name in names}
    else:
        parts = {"train": folder}
    splits, features, prints = {}, {}, []
    for name, part in parts.items():
        state = json.loads((part / "state.json").read_text())
        info = part / "dataset_info.json"
        features = features or (json.loads(info.read_text()).get("features") or {} if info.is_file() else {})
        splits[name] = [part / f["filename"] for f in state["_data_files"]]
        prints.append(str(state.get("_fingerprint", "")))
    return HFSource(folder.name, folder, "save_to_disk", _vit_splits(splits, folder), features=features,
                    fingerprint="+".join(prints) if all(prints) else "")


def _parquet_source(folder: Path) -> HFSource:
    """Parquet files in the Hub's layout: each file's split named in its path (data/train-00000-of-00001.parquet,
    default/validation/0000.parquet); files naming none are one train split."""
    files = sorted(p for pattern in ("*.parquet", "*/*.parquet", "*/*/*.parquet") for p in folder.glob(pattern))
    if not files:
        raise UserPathError(f"{folder} holds no Parquet files and is no save_to_disk folder (no state.json or "
                            "dataset_dict.json)")
    splits: dict[str, list[Path]] = {}
    for f in files:
        found = _SPLIT_IN_PATH.findall(str(f.relative_to(folder)).lower())
        splits.setdefault(found[-1] if found else "", []).append(f)
    if "" in splits and len(splits) > 1:
        raise UserValueError(f"{folder}: some Parquet files name their split and some do not, e.g. "
                             f"{splits[''][0].name}: name each train-*, validation-* or test-*")
    splits = {name or "train": fs for name, fs in splits.items()}
    return HFSource(folder.name, folder, "parquet", _vit_splits(splits, folder))


def _vit_splits(splits: dict[str, list[Path]], folder: Path) -> dict[str, list[Path]]:
    """The data's split names as vit's (validation and valid are val); one split of another name is train."""
    if len(splits) == 1:
        return {"train": next(iter(splits.values()))}
    out = {SPLIT_NAMES[n.lower()]: fs for n, fs in splits.items() if n.lower() in SPLIT_NAMES}
    if "train" not in out:
        raise UserValueError(f"{folder}: no train split among {sorted(splits)}; vit trains on the one named train")
    return out


# ---- reading -------------------------------------------------------------------------------------
def read_split(files: list[Path]) -> Any:
    """One split as a pyarrow Table: Arrow files memory-mapped (nothing read until used), Parquet read once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for f in files:
        if f.suffix == ".parquet":
            tables.append(pq.read_table(f, memory_map=True))
        else:  # save_to_disk writes Arrow's streaming format
            tables.append(pa.ipc.open_stream(pa.memory_map(str(f))).read_all())
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def table_features(table: Any) -> dict[str, Any]:
    """datasets' Features (as JSON) from the schema's metadata, which Parquet and Arrow files of `datasets` hold."""
    meta = (table.schema.metadata or {}).get(b"huggingface")
    return (json.loads(meta).get("info") or {}).get("features") or {} if meta else {}


def image_column(table: Any, features: dict[str, Any], given: str | None, where: str) -> str:
    """The image column: ``given``, else the first of the Image type (or of image bytes), or an error listing all."""
    import pyarrow as pa

    columns = table.column_names
    if given is not None:
        if given not in columns:
            raise UserValueError(f"{where} has no column {given!r} (data.image_column); its columns: {columns}")
        return given
    typed = [c for c in columns if (features.get(c) or {}).get("_type") == "Image"]
    byte_like = [c for c in columns if _image_bytes_type(table.schema.field(c).type, pa)]
    if typed or byte_like:
        return (typed or byte_like)[0]
    raise UserValueError(f"{where} has no image column (an Image feature, or a struct of bytes and path); name one "
                         f"with --data.init_args.image_column; its columns: {_described(table, features)}")


def _image_bytes_type(kind: Any, pa: Any) -> bool:
    if pa.types.is_struct(kind):
        return kind.get_field_index("bytes") >= 0
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _described(table: Any, features: dict[str, Any]) -> str:
    return ", ".join(f"{c} ({(features.get(c) or {}).get('_type') or table.schema.field(c).type})"
                     for c in table.column_names)


LABEL_NAMES = ("label", "labels", "tags", "class", "category", "fine_label", "coarse_label")


def label_column(table: Any, features: dict[str, Any], given: str | None, taken: str, where: str) -> str:
    """The label column: ``given``, else the one ClassLabel (or list of them), else a common name, or an error."""
    columns = [c for c in table.column_names if c != taken]
    if given is not None:
        if given not in table.column_names:
            raise UserValueError(f"{where} has no column {given!r} (data.label_column); its columns: "
                                 f"{table.column_names}")
        return given
    typed = [c for c in columns if _class_names(features.get(c)) is not None]
    if len(typed) == 1:
        return typed[0]
    named = [c for c in LABEL_NAMES if c in columns and (not typed or c in typed)]
    if named:
        return named[0]
    many = f"several ClassLabel columns ({', '.join(typed)})" if typed else "no label column"
    raise UserValueError(f"{where} has {many}: name one with --data.init_args.label_column; its columns: "
                         f"{_described(table, features)}")


def _class_names(feature: Any) -> list[str] | None:
    """The names of a ClassLabel feature, or of the ClassLabel in a Sequence/List of them; None for others."""
    if not isinstance(feature, dict):
        return None
    if feature.get("_type") == "ClassLabel":
        return [str(n) for n in feature.get("names") or []]
    if feature.get("_type") in ("Sequence", "List", "LargeList"):
        return _class_names(feature.get("feature"))
    return None
