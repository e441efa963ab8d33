"""CPU inference speed and top-1 of one classifier four ways, in one run: torch fp32 eager, torch bf16
autocast, ONNX fp32 and ONNX int8 (onnxruntime), plus torch compiled with --compile.

With --ckpt (a digits checkpoint from `vit fit --config configs/digits.yaml`) every path classifies the
digits test set (359 images) and its top-1 is reported; with --model NAME a randomly initialised model
classifies synthetic images: a timing row for a realistic size, where top-1 means nothing and only the
agreement with torch fp32 counts. Paths are timed in alternation (a shared machine slows all alike);
each reports the median img/s of --runs passes over the images and its ratio to torch fp32 eager.

    python scripts/benchmark_inference.py --ckpt logs/digits/checkpoints/best-*.ckpt
    python scripts/benchmark_inference.py --model vit_small_patch16_224 --images 16 --batch_size 8 --skip "torch bf16"
    python scripts/benchmark_inference.py --model vit_small_patch16_224 --threads 2 --compile --json inf.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

import vit
from vit.checkpoint import Classifier, load_classifier
from vit.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from vit.export import INPUT_NAME, onnx_bytes
from vit.inference import autocast, cpu_has_native_bf16
from vit.quantize import quantize_dynamic_int8 as quantize_int8

Runner = Callable[[Tensor], Tensor]


def digits_test_set(classifier: Classifier) -> tuple[Tensor, Tensor]:
    """The digits test split as the DataModule prepares it, at the checkpoint's image size."""
    from vit.data import Digits

    if classifier.in_chans != 1 or classifier.img_size[0] != classifier.img_size[1]:
        raise ValueError(f"--ckpt must be a digits checkpoint (1 channel, square input), got {classifier.in_chans} "
                         f"channels at {classifier.img_size}; use --model NAME for a timing-only row")
    data = Digits(img_size=classifier.img_size[0])
    data.setup("test")
    images, labels = zip(*(data.test_set[i] for i in range(len(data.test_set))))
    return torch.stack(images), torch.as_tensor(labels)


def random_classifier(name: str, num_classes: int) -> Classifier:
    """A randomly initialised named model, prepared like an ImageNet checkpoint."""
    model = vit.create_model(name, num_classes=num_classes).eval()
    chans = model.in_chans
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if chans == 3 else ((0.5,) * chans, (0.5,) * chans)
    return Classifier(model, model_name=name, class_names=[str(i) for i in range(num_classes)], mean=mean, std=std,
                      crop_pct=0.875, interpolation="bicubic")


def onnx_runner(model: bytes, threads: int) -> Runner:
    """An onnxruntime session on ``threads`` threads, as a function of a batch."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return lambda x: torch.from_numpy(session.run(None, {INPUT_NAME: x.numpy()})[0])


def torch_runner(model: Callable[[Tensor], Tensor], precision: str) -> Runner:
    def run(x: Tensor) -> Tensor:
        with torch.inference_mode(), autocast(precision):
            return model(x).float()

    return run


PATHS = ("torch fp32 eager", "torch bf16", "torch fp32 compiled", "onnx fp32", "onnx int8")


def build_runners(classifier: Classifier, threads: int, paths: Sequence[str]) -> dict[str, Runner]:
    """The chosen paths (torch fp32 eager always: the reference), named as in the table."""
    runners = {"torch fp32 eager": torch_runner(classifier, "fp32")}
    if "torch bf16" in paths:
        runners["torch bf16"] = torch_runner(classifier, "bf16")
    if "torch fp32 compiled" in paths:
        runners["torch fp32 compiled"] = torch_runner(torch.compile(classifier.model), "fp32")
    if "onnx fp32" in paths or "onnx int8" in paths:
        fp32 = onnx_bytes(classifier)
        if "onnx fp32" in paths:
            runners["onnx fp32"] = onnx_runner(fp32, threads)
        if "onnx int8" in paths:
            runners["onnx int8"] = onnx_runner(quantize_int8(fp32), threads)
    return runners


def predict_all(run: Runner, images: Tensor, batch_size: int) -> Tensor:
    """Logits of all images, batch by batch."""
    return torch.cat([run(images[i:i + batch_size]) for i in range(0, len(images), batch_size)])


def benchmark(runners: dict[str, Runner], images: Tensor, labels: Tensor | None, batch_size: int,
              runs: int, min_seconds: float = 1.0) -> list[dict]:
    """One row per path: median img/s over ``runs`` interleaved timings, ratio to torch fp32 eager, top-1.

    A timing is as many passes over the images as make torch fp32 take ``min_seconds``: short timings
    measure a shared machine's noise.
    """
    start = time.perf_counter()
    outputs = {"torch fp32 eager": predict_all(runners["torch fp32 eager"], images, batch_size)}
    passes = max(1, math.ceil(min_seconds / (time.perf_counter() - start)))
    outputs |= {name: predict_all(run, images, batch_size) for name, run in runners.items()}  # also warms up
    reference = outputs["torch fp32 eager"].argmax(-1)
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for r in range(runs):
        for name in names if r % 2 == 0 else names[::-1]:  # alternate who goes first
            start = time.perf_counter()
            for _ in range(passes):
                predict_all(runners[name], images, batch_size)
            seconds[name].append((time.perf_counter() - start) / passes)
        print(f"  run {r + 1}/{runs} ({passes} passes): "
              + ", ".join(f"{n} {len(images) / s[-1]:.0f}" for n, s in seconds.items()) + " img/s",
              file=sys.stderr, flush=True)
    base = [len(images) / s for s in seconds["torch fp32 eager"]]
    rows = []
    for name, secs in seconds.items():
        ips = [len(images) / s for s in secs]
        predicted = outputs[name].argmax(-1)
        rows.append({
            "path": name, "img_s": statistics.median(ips),
            "ratio": statistics.median(i / b for i, b in zip(ips, base)),
            "top1": None if labels is None else (predicted == labels).float().mean().item(),
            "agree_fp32": (predicted == reference).float().mean().item(),
            "max_abs_diff": (outputs[name] - outputs["torch fp32 eager"]).abs().max().item(),
        })
    return rows


def print_table(rows: list[dict]) -> None:
    header = f"{'path':20s} {'img/s':>9s} {'vs torch fp32':>14s} {'top-1':>7s} {'same top-1':>11s} {'max |diff|':>11s}"
    print(header)
    print("-" * len(header))
    for r in rows:
        top1 = "n/a" if r["top1"] is None else f"{r['top1']:.4f}"
        print(f"{r['path']:20s} {r['img_s']:9.1f} {r['ratio']:13.2f}x {top1:>7s} {r['agree_fp32']:11.4f} "
              f"{r['max_abs_diff']:11.2e}")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ckpt", help="a digits checkpoint: top-1 on the digits test set")
    source.add_argument("--model", choices=vit.list_models(), help="random weights, synthetic images: timing only")
    parser.add_argument("--num_classes", type=int, default=1000, help="with --model (default: %(default)s)")
    parser.add_argument("--images", type=int, default=32, help="synthetic images with --model (default: %(default)s)")
    parser.add_argument("--batch_size", type=int, default=64, help="images per batch (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=5, help="timings per path (default: %(default)s)")
    parser.add_argument("--min_seconds", type=float, default=1.0,
                        help="a timing repeats passes over the images for at least this long (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch and onnxruntime threads (default: %(default)s)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd fp32")
    parser.add_argument("--skip", nargs="+", default=[], choices=[p for p in PATHS if p != "torch fp32 eager"],
                        metavar="PATH", help="paths to leave out, e.g. --skip 'torch bf16' where bf16 is emulated")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    if args.ckpt:
        classifier = load_classifier(args.ckpt)
        images, labels = digits_test_set(classifier)
    else:
        classifier = random_classifier(args.model, args.num_classes)
        images = torch.randn(args.images, classifier.in_chans, *classifier.img_size,
                             generator=torch.Generator().manual_seed(0))
        labels = None
    bf16 = {True: "native", False: "emulated", None: "unknown"}[cpu_has_native_bf16()]
    print(f"{classifier.model_name}, {len(images)} images, batch {args.batch_size}, {args.threads} thread(s), "
          f"torch {torch.__version__}, {platform.processor() or platform.machine()}, bf16 {bf16}", flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's and bf16's warnings: the header says it already
        paths = [p for p in PATHS if p not in args.skip and (args.compile or p != "torch fp32 compiled")]
        rows = benchmark(build_runners(classifier, args.threads, paths), images, labels, args.batch_size, args.runs,
                         args.min_seconds)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": classifier.model_name, "images": len(images), "batch_size": args.batch_size,
                       "threads": args.threads, "torch": torch.__version__, "bf16": bf16, "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    main()
