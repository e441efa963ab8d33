"""Streaming shards: an image folder written as LitData chunks (and optionally WebDataset tars).

```
SRC/<class>/<image> or SRC/{train,val[,test]}/<class>/<image>
  └─► OUT/info.json                 class names, split sizes and class counts, the source, max_side, bad files
      OUT/{train,val[,test]}/       litdata.optimize's chunks + index.json: one sample =
                                    {"image": the file's bytes, "label": class index, "id": its path under SRC}
      OUT/wds/                      with webdataset: {split}-000000.tar ... (key.jpg|png, key.cls, key.json)
                                    and the _info.json that timm's create_dataset("wds/...") reads
```
The splits are ImageFolder's (same fractions and seed), so shards and folder hold the same images.
Each image is decoded in full once while writing: files that fail are reported and left out, as
``skip_bad_images`` does in training. ``max_side`` re-encodes images whose shorter side is larger
(JPEG quality 90, or PNG for other formats); all others keep their original bytes. ``info.json`` is
written last, so its presence marks finished shards; an interrupted run resumes split by split.
No Lightning here: the reading side is `vit.data.stream`.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import shutil
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from PIL import Image

from vit.data.io import decode, describe_bad_files, exif_orientation, open_image
from vit.errors import UserPathError, UserValueError
from vit.files import cache_dir, save_atomic
from vit.network import unreachable
from vit.progress import progress, progress_while

log = logging.getLogger(__name__)

INFO = "info.json"
PLAN = ".vit-shard-plan.json"  # what a run set out to write, so a second run can resume it or refuse
FORMAT = "vit-shards/1"
URL_SCHEMES = ("s3", "gs")
# Where each object store answers when no endpoint is configured (AWS_ENDPOINT_URL overrides S3's).
_ENDPOINTS = {"s3": ("s3.amazonaws.com", 443), "gs": ("storage.googleapis.com", 443)}
PROGRESS_EVERY = 64  # samples between a shard worker's progress notes
_WDS_EXT = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}  # what timm's wds reader decodes (input_key jpg;png;webp)


# ---- writing ---------------------------------------------------------------------------------------
def _shrink(img: Image.Image, max_side: int) -> bytes:
    """``img`` with its shorter side resized to ``max_side`` (bicubic), encoded as JPEG 90 (4:2:0) or PNG.

    4:2:0 decodes faster than 4:4:4; a lower quality would save little of the loader's time at a visible cost,
    and Huffman ``optimize`` makes files smaller, not faster (docs/speed.md, "choices measured")."""
    shown = decode(img)  # RGB, turned as its EXIF orientation says: the re-encoded file keeps no EXIF
    w, h = shown.size
    scale = max_side / min(w, h)
    small = shown.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    if img.format == "JPEG":
        small.save(out, "JPEG", quality=90, subsampling="4:2:0")  # Pillow's default too; said, as it decodes faster
    else:
        small.save(out, "PNG")
    return out.getvalue()


_done_here = 0  # samples this worker process has handled: each forked worker counts its own


def encode_sample(item: tuple[str, int, str], max_side: int | None, bad_dir: str, progress_dir: str
                  ) -> Iterator[dict[str, Any]]:
    """One shard sample from (path, label, id), or none for a file that does not decode (noted in ``bad_dir``).

    Runs in litdata.optimize's worker processes; a generator, so a bad file simply yields nothing. Every
    `PROGRESS_EVERY` samples the worker writes its count to ``progress_dir``/<pid>, for the progress bar."""
    global _done_here
    _done_here += 1
    if _done_here % PROGRESS_EVERY == 0:
        Path(progress_dir, str(os.getpid())).write_text(str(_done_here))
    path, label, sample_id = item
    try:
        data = Path(path).read_bytes()
        with Image.open(io.BytesIO(data)) as img:
            shrink = bool(max_side) and min(img.size) > max_side
            if shrink and img.format == "JPEG":
                img.draft("RGB", (max_side, max_side))  # DCT scaling: decode at >= the target size, cheaply
            img.load()  # the whole file: truncated data fails here, not in training
            if shrink:
                data = _shrink(img, max_side)
    except Exception as e:  # PIL raises several types for bad files; all mean the same to a user
        with open(Path(bad_dir) / f"{os.getpid()}.tsv", "a") as f:
            f.write(f"{sample_id}\t{type(e).__name__}: {e}".replace("\n", " ") + "\n")
        return
    yield {"image": data, "label": int(label), "id": sample_id}


def _count_done(progress_dir: Path) -> int:
    """Samples handled so far by the workers that note their counts in ``progress_dir``."""
    done = 0
    for note in progress_dir.glob("*"):
        with contextlib.suppress(OSError, ValueError):  # a note being rewritten reads as empty: skip it this time
            done += int(note.read_text())
    return done


def _relative(path: str, root: Path) -> str:
    return Path(path).relative_to(root).as_posix()


def write_shards(
    src: str | os.PathLike, out: str | os.PathLike, *, max_side: int | None = None, webdataset: bool = False,
    val_fraction: float = 0.1, test_fraction: float = 0.1, seed: int = 0, num_workers: int | None = None,
    chunk_bytes: str = "64MB", samples_per_tar: int = 10_000,
) -> dict[str, Any]:
    """Write the image folder ``src`` as shards under ``out`` (see the module docstring); returns info.json's dict.

    A finished ``out`` is refused; an unfinished one written from the same source and options is resumed
    (finished splits kept, the interrupted one rewritten); anything else in ``out`` is refused."""
    import litdata

    from vit.data.folder import ImageFolder

    src, out = Path(src), Path(out)
    if max_side is not None and max_side < 1:
        raise UserValueError(f"--max_side must be a positive number of pixels, got {max_side}")
    folder = ImageFolder(str(src), val_fraction=val_fraction, test_fraction=test_fraction, seed=seed,
                         check_images=False, num_workers=0)
    splits = folder.splits()
    plan = {"format": FORMAT, "source": str(src.resolve()), "max_side": max_side, "webdataset": webdataset,
            "val_fraction": val_fraction, "test_fraction": test_fraction, "seed": seed,
            "inputs": {name: len(samples) for name, samples in splits.items()}}
    _claim(out, plan)
    num_workers = num_workers or max(1, min(len(os.sched_getaffinity(0)), 16))
    bad_dir = out / ".bad"
    bad_dir.mkdir(exist_ok=True)
    for name, samples in splits.items():
        target = out / name
        if (target / "index.json").is_file():
            continue  # finished by an earlier run
        shutil.rmtree(target, ignore_errors=True)  # an interrupted split starts over
        inputs = [(path, label, _relative(path, src)) for path, label in samples]
        notes = out / ".progress" / name
        shutil.rmtree(notes, ignore_errors=True)
        notes.mkdir(parents=True)
        encode = functools.partial(encode_sample, max_side=max_side, bad_dir=str(bad_dir), progress_dir=str(notes))
        with progress_while(functools.partial(_count_done, notes), len(inputs), f"{name}: shards"):
            # verbose=False: no worker chatter, no hosted-service advert; the bar above says how far it is
            litdata.optimize(encode, inputs, str(target), chunk_bytes=chunk_bytes, reorder_files=False,
                             num_workers=min(num_workers, len(inputs)), start_method="fork", verbose=False)
    bad = sorted(line.rstrip("\n").split("\t", 1) for f in bad_dir.glob("*.tsv") for line in f.open())
    bad_ids = {sample_id for sample_id, _ in bad}
    info: dict[str, Any] = {
        "format": FORMAT, "source": plan["source"], "class_names": folder.class_names, "max_side": max_side,
        "splits": {}, "class_counts": {}, "bad_files": bad,
    }
    for name, samples in splits.items():
        labels = [label for path, label in samples if _relative(path, src) not in bad_ids]
        info["splits"][name] = len(labels)
        info["class_counts"][name] = [labels.count(c) for c in range(len(folder.class_names))]
    if webdataset:
        write_webdataset(out, info, samples_per_tar)
    _write_json(out / INFO, info)
    shutil.rmtree(bad_dir)
    shutil.rmtree(out / ".progress")
    (out / PLAN).unlink()
    if bad:
        total = sum(plan["inputs"].values())
        log.warning("%s: left out %s", src, describe_bad_files([tuple(b) for b in bad], total))
    return info


def _claim(out: Path, plan: dict[str, Any]) -> None:
    """Refuse an ``out`` that holds finished shards or something else; note the plan of this run."""
    if (out / INFO).is_file():
        raise UserPathError(f"{out} already holds finished shards ({out / INFO}); delete it or write to another "
                            "folder")
    if (out / PLAN).is_file():
        earlier = json.loads((out / PLAN).read_text())
        if earlier != plan:
            changed = sorted(k for k in plan if earlier.get(k) != plan[k])
            raise UserPathError(f"{out} holds an unfinished run with other settings ({', '.join(changed)}); run it "
                                "again as it was to resume it, or delete the folder")
        log.warning("%s: resuming an unfinished run (finished splits are kept)", out)
    elif out.exists() and any(out.iterdir()):
        raise UserPathError(f"{out} is not empty and holds no shards; choose an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / PLAN, plan)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    text = json.dumps(data, indent=1).encode()
    save_atomic(lambda f: f.write(text), path)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size, member.mode = len(data), 0o644
    tar.addfile(member, io.BytesIO(data))


def _add_sample(tar: tarfile.TarFile, key: str, sample: dict[str, Any]) -> None:
    """One sample as webdataset files: ``key.jpg|png|webp`` (other formats as PNG), ``key.cls``, ``key.json``."""
    data = bytes(sample["image"])
    with Image.open(io.BytesIO(data)) as img:
        ext = _WDS_EXT.get(img.format)
        # a format timm's reader does not decode, or a photo it would read as stored, not turned as vit shows it
        if ext is None or exif_orientation(img) != 1:
            buffer = io.BytesIO()
            if ext == "jpg":
                decode(img).save(buffer, "JPEG", quality=95)
            else:
                decode(img).save(buffer, "PNG")
                ext = "png"
            data = buffer.getvalue()
    _add(tar, f"{key}.{ext}", data)
    _add(tar, f"{key}.cls", str(int(sample["label"])).encode())
    _add(tar, f"{key}.json", json.dumps({"id": sample["id"], "label": int(sample["label"])}).encode())


def _write_tar(path: Path, samples: Iterator[tuple[str, dict[str, Any]]]) -> None:
    """A tar of webdataset ``samples`` (key, sample), written atomically: a kill mid-tar leaves no torn shard."""

    def write(f: Any) -> None:
        with tarfile.open(fileobj=f, mode="w") as tar:
            for key, sample in samples:
                _add_sample(tar, key, sample)

    save_atomic(write, path)


def write_webdataset(out: Path, info: dict[str, Any], samples_per_tar: int = 10_000) -> None:
    """``out/wds``: each split's samples as tar shards (``key.jpg|png|webp``, ``key.cls``, ``key.json``)
    plus the ``_info.json`` timm's ``wds/`` reader needs (names, sample counts, file names, lengths)."""
    from litdata import StreamingDataset

    wds = out / "wds"
    wds.mkdir(exist_ok=True)
    splits_info = {}
    for name in info["splits"]:
        dataset = StreamingDataset(str(out / name))
        filenames, lengths = [], []
        indices = iter(progress(range(len(dataset)), len(dataset), f"webdataset {name}"))
        for start in range(0, len(dataset), samples_per_tar):
            filenames.append(f"{name}-{len(filenames):06d}.tar")
            lengths.append(min(samples_per_tar, len(dataset) - start))
            # range first: zip then stops without taking one; keys end at the first dot: the path goes in json
            _write_tar(wds / filenames[-1], ((f"{i:08d}", dataset[i]) for _, i in zip(range(lengths[-1]), indices)))
        next(indices, None)  # closes the progress bar
        splits_info[name] = {"name": name, "num_samples": sum(lengths), "filenames": filenames,
                             "shard_lengths": lengths}
    _write_json(wds / "_info.json", {"name": Path(info["source"]).name, "splits": splits_info,
                                     "class_names": info["class_names"]})


# ---- reading ---------------------------------------------------------------------------------------
def is_url(root: str) -> bool:
    """Whether ``root`` names an object store (s3://..., gs://...) rather than a local folder."""
    return urlparse(str(root)).scheme in URL_SCHEMES


def check_reachable(url: str, timeout: float = 3.0) -> None:
    """Fail fast, and clearly, when the object store behind ``url`` cannot be reached (offline, no DNS):
    the storage clients would otherwise retry for minutes."""
    scheme = urlparse(url).scheme
    host, port = _ENDPOINTS[scheme]
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if scheme == "s3" and endpoint:
        parsed = urlparse(endpoint)
        host, port = parsed.hostname or host, parsed.port or (443 if parsed.scheme == "https" else 80)
    why = unreachable(host, port, timeout)
    if why:
        raise UserPathError(f"cannot reach {url}: {why}. Check the network and credentials, or copy the shards to "
                            "a local folder and give its path")


def read_info(root: str, cache_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """The shards' info.json from a folder or an object-store URL (downloaded into ``cache_dir``)."""
    if is_url(root):
        from litdata.streaming.downloader import get_downloader

        check_reachable(root)
        local = Path(cache_dir or url_cache_dir(root)) / INFO
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            get_downloader(root, str(local.parent), []).download_file(f"{root.rstrip('/')}/{INFO}", str(local))
        except Exception as e:
            raise UserPathError(f"cannot read {root.rstrip('/')}/{INFO}: {type(e).__name__}: {e}; are these "
                                "shards written by `vit shard`?") from e
    else:
        local = Path(root) / INFO
        if not local.is_file():
            hint = " (an unfinished `vit shard` run: run it again to finish)" if (Path(root) / PLAN).is_file() else ""
            raise UserPathError(f"no shards in {root}: {local} not found{hint}; write them with "
                                f"`vit shard IMAGE_FOLDER {root}`")
    info = json.loads(local.read_text())
    if info.get("format") != FORMAT:
        raise UserValueError(f"{local}: format {info.get('format')!r}, expected {FORMAT!r}")
    return info


def url_cache_dir(url: str) -> Path:
    """Where chunks of ``url`` are cached when no cache folder is given: <vit's cache>/shards/<bucket>/<path>."""
    parsed = urlparse(url)
    return cache_dir("shards", parsed.netloc, *Path(parsed.path.strip("/")).parts)


def split_dir(root: str, split: str, cache_dir: str | os.PathLike | None) -> Any:
    """What litdata's StreamingDataset reads one split from: the local folder, or a Dir(cache, url)."""
    if not is_url(root):
        return str(Path(root) / split)
    from litdata.streaming.resolver import Dir

    return Dir(path=str(Path(cache_dir or url_cache_dir(root)) / split), url=f"{root.rstrip('/')}/{split}")


@contextlib.contextmanager
def opened(data: Sequence[int] | bytes | memoryview, sample_id: str) -> Iterator[Image.Image]:
    """A shard sample's bytes opened but not decoded (`vit.data.io.open_image`), for a transform that decodes
    (`FastTrainTransform`); a failure to read it, there or in the ``with`` body, is an OSError naming the sample."""
    try:
        with open_image(io.BytesIO(bytes(data))) as img:
            yield img
    except OSError as e:
        raise OSError(f"cannot decode shard sample {sample_id}: {e.__cause__ or e}") from e


def decode_sample(data: Sequence[int] | bytes | memoryview, sample_id: str) -> Image.Image:
    """A shard sample's bytes decoded to RGB, as `vit.data.io.load_image` decodes a file."""
    with opened(data, sample_id) as img:
        return decode(img)
