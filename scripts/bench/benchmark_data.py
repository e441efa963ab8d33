"""Loader throughput per core: our ImageFolder training pipeline against torchvision's ImageFolder
with timm's ``create_transform``, and against the same images streamed from shards (`vit shard`,
`ImageShards`), as written and pre-resized (``--max_side``, default 320), on the same ImageNet-sized
JPEGs, with the same DeiT augmentation.

What one DataLoader worker does is timed on one thread (num_workers=0, so no process start-up or
IPC): read, decode, augment and collate batches of ``--batch_size``. The pipelines run in
alternation (ours, timm, shards, shards pre-resized, ours, ...) so that a shared, noisy machine
hurts all alike; the median img/s of ``--runs`` runs each, and the medians of the paired ratios
(against timm, and shards against the folder), are reported. A per-stage
breakdown follows (ms per image). Ours leaves normalisation and random erasing to the device
(``ImageDataModule.on_after_batch_transfer``); their cost on this CPU is shown, not counted.

``--model_img_s`` turns the per-core rate into loader cores per GPU. Its default, 3000 img/s, is
issue 9's goal for ``vit_base_patch16_224`` training in bf16 on one H200 (not measured here).

    python scripts/bench/benchmark_data.py                          # 2 classes x 100 JPEGs, 500x375
    python scripts/bench/benchmark_data.py --runs 7 --json data.json
    python scripts/bench/benchmark_data.py --root /data/imagenet    # any root/train/<class>/<image> folder
    python scripts/bench/benchmark_data.py --size 4032x3024 --per_class 20 --no_shards   # phone photos
"""

from __future__ import annotations

import argparse
import io
import json
import math
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

DEIT = dict(auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, color_jitter=0.4, interpolation="bicubic")


def photos() -> list[np.ndarray]:
    """Real photos available offline: sklearn's two samples, and scikit-image's when it is installed."""
    from sklearn.datasets import load_sample_images

    found = list(load_sample_images().images)
    try:
        from skimage import data
    except ImportError:
        return found
    return found + [getattr(data, name)() for name in ("astronaut", "chelsea", "coffee", "rocket")]


def write_jpegs(root: Path, classes: int = 2, per_class: int = 100, size: tuple[int, int] = (500, 375),
                seed: int = 0) -> Path:
    """root/{train,val}/c<k>/<i>.jpg: random crops (half the area or more) of real photos, randomly
    flipped, resized to ``size`` (ImageNet's typical 500x375) and saved at JPEG quality 90. Enlarged over twice
    (to a phone's 4032x3024), they get a grain of 3 grey levels: ~2.5 MB a file, as a phone's, not 1 MB."""
    rng = np.random.default_rng(seed)
    sources = [Image.fromarray(p) for p in photos()]
    for split, n in (("train", per_class), ("val", 1)):
        for c in range(classes):
            folder = root / split / f"c{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                src = sources[rng.integers(len(sources))]
                w, h = src.size
                cw, ch = (int(side * rng.uniform(0.7, 1.0)) for side in (w, h))
                x, y = rng.integers(0, w - cw + 1), rng.integers(0, h - ch + 1)
                img = src.crop((x, y, x + cw, y + ch)).resize(size, Image.Resampling.BICUBIC)
                if size[0] > 2 * cw:  # a phone photo's size: a camera's grain, not an enlargement's smoothness
                    grain = rng.normal(0, 3, (size[1], size[0], 3))
                    img = Image.fromarray(np.clip(np.asarray(img) + grain, 0, 255).astype(np.uint8))
                if rng.random() < 0.5:
                    img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                img.save(folder / f"{i}.jpg", quality=90)
    return root


def pipelines(root: Path, img_size: int, batch_size: int, shards: Path | None = None,
              max_side: int = 320) -> dict[str, DataLoader]:
    """Our ImageFolder's training loader, and torchvision's ImageFolder + timm's create_transform; with
    ``shards`` (a folder to write them in), also ImageShards over the same images, as they are and
    re-encoded to ``max_side``."""
    from timm.data import create_transform
    from torchvision.datasets import ImageFolder as TorchvisionFolder

    from vit.data import ImageFolder
    from vit.data.transforms import guard_posterize

    dm = ImageFolder(str(root), batch_size=batch_size, num_workers=0, img_size=img_size, **DEIT)
    dm.setup("fit")
    # timm's transform as DeiT configures it; guarded, or Pillow 13 crashes it on ~0.3% of images
    transform = guard_posterize(create_transform(img_size, is_training=True, re_mode="pixel", **DEIT))
    theirs = TorchvisionFolder(str(root / "train"), transform=transform)
    loaders = {"ours": dm.train_dataloader(),
               "timm": DataLoader(theirs, batch_size=batch_size, shuffle=True, drop_last=True)}
    if shards is not None:
        from vit.data import ImageShards
        from vit.data.shards import write_shards

        for name, side in (("shards", None), (f"shards_{max_side}", max_side)):
            write_shards(root, shards / name, max_side=side, num_workers=2)
            streamed = ImageShards(str(shards / name), batch_size=batch_size, num_workers=0, img_size=img_size,
                                   **DEIT)
            streamed.setup("fit")
            loaders[name] = streamed.train_dataloader()
    return loaders


def img_per_s(loader: DataLoader, images: int) -> float:
    """Images per second through ``loader`` (what one worker does), over about ``images`` images."""
    done, start = 0, time.perf_counter()
    while done < images:
        for x, _ in loader:
            done += len(x)
            if done >= images:
                break
    return done / (time.perf_counter() - start)


def per_image_ms(steps: list[tuple[str, Callable]], inputs: list, repeat: int) -> dict[str, float]:
    """Mean ms per image of each step of a chain, applied in order to each input. The k-th input of each
    repeat gets the same random draws in every chain (crop box, flip, RandAugment ops), so chains compare."""
    from vit.data.stream import mixed_seed, seed_transform

    total = dict.fromkeys([name for name, _ in steps], 0.0)
    for r in range(repeat):
        for k, x in enumerate(inputs):
            seed_transform(mixed_seed(r, k))
            for name, step in steps:
                start = time.perf_counter()
                x = step(x)
                total[name] += time.perf_counter() - start
    return {name: 1e3 * t / (repeat * len(inputs)) for name, t in total.items()}


def stages(loaders: dict[str, DataLoader], files: list[str], repeat: int,
           shards: dict[str, Path] | None = None) -> dict[str, dict[str, float]]:
    """Where the time goes, per image: decoding, then each transform step. With ``shards`` (name -> folder),
    also our steps on the same images' stored bytes, decoded from memory (pre-resized: fewer pixels)."""
    from vit.data import fast
    from vit.data.io import load_image, open_image
    from vit.data.resume import SeededSamples
    from vit.data.transforms import IMAGENET_MEAN, IMAGENET_STD, Augmentation, batch_transform

    dataset = loaders["ours"].dataset  # the files, behind the resumable per-sample seeding (SeededSamples)
    ours = (dataset.dataset if isinstance(dataset, SeededSamples) else dataset).transform  # FastTrainTransform
    c = ours.crop

    def decode_for_crop(img: Image.Image) -> tuple[Image.Image, tuple]:
        # the box from the header's size, then the pixels: a JPEG at least twice the box's output at 1/2-1/8
        return fast.decode_for_crop(img, c.get_params(img, c.scale, c.ratio), c.size)

    def crop_flip(decoded: tuple[Image.Image, tuple]) -> np.ndarray:
        img, box = decoded
        return fast.resized_crop(img, box, c.size, c.interpolation, bool(torch.rand(1) < ours.hflip))

    def augment(planes: np.ndarray) -> Image.Image:
        return ours.ops(Image.merge("RGB", [Image.fromarray(p) for p in planes]))

    def to_tensor(img: Image.Image) -> torch.Tensor:
        return torch.from_numpy(np.array(img)).permute(2, 0, 1)

    ours_steps = [("open", open_image), ("decode", decode_for_crop), ("crop+resize+flip", crop_flip),
                  ("augment", augment), ("to tensor", to_tensor)]
    rows = {"ours": per_image_ms(ours_steps, files, repeat)}
    if shards:
        from litdata import StreamingDataset

        ids = [Path(f).relative_to(Path(f).parents[2]).as_posix() for f in files]  # train/c0/1.jpg: as sharded
        for name, folder in shards.items():
            stored = StreamingDataset(str(folder / "train"))
            by_id = {item["id"]: bytes(item["image"]) for item in (stored[i] for i in range(len(stored)))}
            blobs = [by_id[i] for i in ids]  # the same images, in the same order as ``files``
            steps = [("open", lambda data: open_image(io.BytesIO(data))), *ours_steps[1:]]
            rows[name] = per_image_ms(steps, blobs, repeat)
    theirs = loaders["timm"].dataset.transform.transforms  # crop, flip, RandAugment, ToTensor, Normalize, erase
    names = ["crop+resize", "flip", "augment", "to tensor", "normalise", "erase"]
    rows["timm"] = per_image_ms([("decode", load_image), *zip(names, theirs)], files, repeat)
    # ours normalises and erases on the device, per batch: its cost on this CPU, for reference
    batch = torch.stack([ours(load_image(f)) for f in files])
    finish = batch_transform(Augmentation(re_prob=DEIT["re_prob"]), IMAGENET_MEAN, IMAGENET_STD)
    start = time.perf_counter()
    for _ in range(repeat):
        finish(batch)
    rows["ours"]["(device) normalise+erase"] = 1e3 * (time.perf_counter() - start) / (repeat * len(files))
    return rows


def pixel_ratio(shards: Path, root: Path) -> float:
    """Pixels of the pre-resized training images in ``shards`` over their originals' in ``root``."""
    from litdata import StreamingDataset

    stored = StreamingDataset(str(shards / "train"))
    small = big = 0
    for i in range(len(stored)):
        item = stored[i]
        with Image.open(io.BytesIO(bytes(item["image"]))) as a, Image.open(root / item["id"]) as b:
            small, big = small + a.width * a.height, big + b.width * b.height
    return small / big


def bound(folder_ms: float, resized_ms: float, decode_ms: float, resized_decode_ms: float,
          pixels: float, target: float = 1.5) -> dict[str, float]:
    """What pre-resizing can give at most, in ms per image and ratios against the folder.

    ``decode_free``: the pre-resized pipeline's ratio were its decode free (all else as measured);
    ``decode_by_pixels``: the folder's, had decode alone shrunk with the pixel ratio (all else equal);
    ``decode_budget_ms``: the decode time per image that ``target`` leaves to the pre-resized pipeline."""
    rest = resized_ms - resized_decode_ms
    return {"pixel_ratio": pixels, "folder_ms": folder_ms, "resized_ms": resized_ms,
            "resized_decode_ms": resized_decode_ms, "resized_rest_ms": rest, "decode_free": folder_ms / rest,
            "decode_by_pixels": folder_ms / (folder_ms - (1 - pixels) * decode_ms), "target": target,
            "decode_budget_ms": folder_ms / target - rest}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", help="a folder with train/<class>/<images>; default: JPEGs written to a temp dir")
    parser.add_argument("--per_class", type=int, default=100, help="JPEGs per class to write (2 classes)")
    parser.add_argument("--size", default="500x375",
                        help="WxH of the JPEGs written: ImageNet's typical 500x375, or a phone's 4032x3024")
    parser.add_argument("--img_size", type=int, default=224)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--images", type=int, default=192, help="images per timed run")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per pipeline; medians are reported")
    parser.add_argument("--model_img_s", type=float, default=3000.0,
                        help="the model's training img/s per GPU (default: issue 9's ViT-B/16 bf16 H200 goal)")
    parser.add_argument("--host_cores", type=int, default=16, help="CPU cores per GPU on the training host")
    parser.add_argument("--max_side", type=int, default=320, help="shorter side of the pre-resized shards")
    parser.add_argument("--no_shards", action="store_true", help="time the folder pipelines only")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as in a DataLoader worker

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.root) if args.root else write_jpegs(Path(tmp), per_class=args.per_class,
                                                                size=tuple(map(int, args.size.split("x"))))
        shards = None if args.no_shards else Path(tmp) / "shards"
        loaders = pipelines(root, args.img_size, args.batch_size, shards, args.max_side)
        for loader in loaders.values():
            img_per_s(loader, args.batch_size)  # warm-up: imports, first allocations
        rates: dict[str, list[float]] = {name: [] for name in loaders}
        for _ in range(args.runs):
            for name, loader in loaders.items():
                rates[name].append(img_per_s(loader, args.images))
        files = [path for path, _ in loaders["timm"].dataset.samples[:: max(1, len(loaders["timm"].dataset) // 32)]]
        stored = {name: shards / name for name in loaders if shards is not None and name.startswith("shards")}
        breakdown = stages(loaders, files, repeat=2, shards=stored)
        resized = f"shards_{args.max_side}"
        pixels = pixel_ratio(stored[resized], root) if resized in stored else None

    ours, theirs = statistics.median(rates["ours"]), statistics.median(rates["timm"])
    medians = {name: statistics.median(r) for name, r in rates.items()}
    result = {
        "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread",
        "img_size": args.img_size, "batch_size": args.batch_size, "augmentation": DEIT,
        "ours_img_s": ours, "timm_img_s": theirs,
        "ratio_median": statistics.median(a / b for a, b in zip(rates["ours"], rates["timm"])),
        "runs": rates, "stages_ms": breakdown, "model_img_s": args.model_img_s, "img_s": medians,
        # each pipeline against our folder pipeline, run by run (the shards' targets: >= 1.0 and, pre-resized, 1.5)
        "vs_folder": {name: statistics.median(a / b for a, b in zip(r, rates["ours"])) for name, r in rates.items()},
        "cores_needed": {name: math.ceil(args.model_img_s / rate) for name, rate in medians.items()},
        "host_img_s": {name: rate * args.host_cores for name, rate in medians.items()},
    }
    if pixels is not None:
        decode_ms = {name: breakdown[name]["open"] + breakdown[name]["decode"] for name in ("ours", resized)}
        result["bound"] = bound(1e3 / ours, 1e3 / medians[resized], decode_ms["ours"], decode_ms[resized], pixels)
    report(result, args.host_cores)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


def report(r: dict, host_cores: int) -> None:
    print(f"{r['machine']}; {r['img_size']}px, batch {r['batch_size']}, {r['augmentation']}")
    print(f"per core: ours {r['ours_img_s']:.0f} img/s, torchvision+timm {r['timm_img_s']:.0f} img/s, "
          f"ratio {r['ratio_median']:.2f} (median of {len(r['runs']['ours'])} paired runs)")
    print(f"{'ms per image':25s}" + "".join(f"{name:>12s}" for name in r["stages_ms"]))
    steps = dict.fromkeys(step for row in r["stages_ms"].values() for step in row)
    for step in steps:
        print(f"{step:25s}" + "".join(f"{row[step]:12.2f}" if step in row else f"{'':12s}"
                                      for row in r["stages_ms"].values()))
    print(f"{'pipeline':25s}{'img/s':>10s}{'vs folder':>10s}{'cores at':>10s}")
    for name, rate in r["img_s"].items():
        print(f"{name:25s}{rate:10.0f}{r['vs_folder'][name]:10.2f}{r['cores_needed'][name]:10d}")
    print(f"'cores at': loader cores a GPU training at {r['model_img_s']:.0f} img/s needs; {host_cores} cores give "
          + ", ".join(f"{r['host_img_s'][name]:.0f} ({name})" for name in r["img_s"]) + " img/s")
    b = r.get("bound")
    if b:
        print(f"pre-resized: {b['pixel_ratio']:.2f}x the pixels; {b['resized_ms']:.2f} ms per image, of which decode "
              f"{b['resized_decode_ms']:.2f}. Were decode free: {b['decode_free']:.2f}x the folder; had decode alone "
              f"shrunk with the pixels: {b['decode_by_pixels']:.2f}x. {b['target']}x leaves decode "
              f"{b['decode_budget_ms']:.2f} ms per image")


if __name__ == "__main__":
    main()
