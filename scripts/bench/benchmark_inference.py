"""The backend table for this CPU: every `vit predict --backend` on one classifier, in one run.

A row per backend: img/s at batch 1 and at --batch_size, the ratio to torch fp32 eager at each, max |logit
difference| and top-1 agreement with eager on the test images, and test accuracy; the header gives the CPU's
flags and the thread count. It ends by naming the fastest exact backend (logits within 1e-4) and the fastest
within tolerance (top-1 agreement >= 99% and accuracy within 0.5 points of eager's).

With --ckpt and --config (the `vit fit` config it was trained with) the test split is scored and the static
int8 rows are calibrated on 300 images of the training split, both through the eval transform, as `vit export
--int8 static --calibration CONFIG` does. With --model NAME a randomly initialised model classifies synthetic
images: a timing row for a realistic size, where accuracy means nothing (calibration: other synthetic images).
Backends are timed in alternation (a shared machine slows all alike): median img/s of --runs timings.

    python scripts/bench/benchmark_inference.py --ckpt logs/digits/checkpoints/best-*.ckpt --config configs/digits.yaml
    python scripts/bench/benchmark_inference.py --ckpt logs/folder_cpu/checkpoints/best-*.ckpt \
        --config configs/finetune/folder_cpu.yaml --root photos/
    python scripts/bench/benchmark_inference.py --model vit_small_patch16_224 --images 16 --batch_size 8 --threads 2 \
        --compile
"""

from __future__ import annotations

import argparse
import copy
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
from vit.cli.data import config_split_images
from vit.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from vit.deploy import Classifier, auto, load_classifier
from vit.deploy.backends import Bf16Classifier, CompiledClassifier, OpenVinoClassifier
from vit.deploy.cpu import describe_cpu, has_native_bf16, reduce_range_for
from vit.deploy.export import onnx_bytes
from vit.deploy.inference import OnnxClassifier, autocast
from vit.deploy.quantize import CALIBRATION_IMAGES, KEEP_FP32, quantize_dynamic_int8, quantize_static_int8

Runner = Callable[[Tensor], Tensor]
REFERENCE = "torch"
EXACT_TOLERANCE = 1e-4
BACKENDS = ("torch", "torch autocast bf16", "torch-bf16", "torch-bf16 sdpa", "torch-compile", "torch-compile-bf16",
            "onnx", "onnx-int8", "onnx-int8 dynamic", "openvino", "openvino-bf16", "openvino-int8")
# what `--backend auto` chooses among, for a checkpoint and for its int8 file (vit.deploy.backends.auto_candidates)
AUTO_SETS = {"auto": ("torch", "openvino-bf16", "torch-bf16", "openvino", "onnx"),
             "auto (int8 file)": ("onnx-int8", "openvino-int8")}
EXACT = ("torch", "torch-compile", "onnx", "openvino")


def config_splits(config: str, root: str | None, count: int, classifier: Classifier, seed: int = 0
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """(test images, test labels, ``count`` training images) of a `vit fit` config's DataModule, each decoded as
    stored and prepared by the checkpoint's eval transform, as `vit predict` prepares a file (the calibration
    images drawn at random by ``seed``; `vit export --int8 static --calibration CONFIG` draws with seed 0)."""
    transform, mode = classifier.eval_transform(), "L" if classifier.in_chans == 1 else "RGB"
    images, labels = config_split_images(config, "test", transform, mode, root=root)
    return images, labels, config_split_images(config, "train", transform, mode, count, seed=seed, root=root)[0]


def random_classifier(name: str, num_classes: int) -> Classifier:
    """A randomly initialised named model, prepared like an ImageNet checkpoint."""
    torch.manual_seed(0)  # the same weights every run: rows and their agreement compare across runs
    model = vit.create_model(name, num_classes=num_classes).eval()
    chans = model.in_chans
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if chans == 3 else ((0.5,) * chans, (0.5,) * chans)
    return Classifier(model, model_name=name, class_names=[str(i) for i in range(num_classes)], mean=mean, std=std,
                      crop_pct=0.875, interpolation="bicubic")


def build_runners(classifier: Classifier, calibration: Tensor, threads: int, names: Sequence[str]) -> dict[str, Runner]:
    """The chosen backends as `vit predict --backend` builds them (torch eager always: the reference)."""
    def no_grad(model: Callable[[Tensor], Tensor]) -> Runner:
        return torch.inference_mode()(lambda x: model(x).float())

    def autocast_bf16(x: Tensor) -> Tensor:
        with torch.inference_mode(), autocast("bf16"):
            return classifier(x).float()

    runners = {REFERENCE: no_grad(classifier)}
    if "torch autocast bf16" in names:
        runners["torch autocast bf16"] = autocast_bf16
    if "torch-bf16" in names:
        runners["torch-bf16"] = Bf16Classifier(copy.deepcopy(classifier))
    if "torch-bf16 sdpa" in names:  # SDPA's bf16 kernel, which torch-bf16 leaves for two matmuls without AMX
        runners["torch-bf16 sdpa"] = Bf16Classifier(copy.deepcopy(classifier), explicit_attention=False)
    for name in ("torch-compile", "torch-compile-bf16"):
        if name in names:  # no padding: batch 1 gets its own graph here, as a service answering one image would
            runners[name] = CompiledClassifier(copy.deepcopy(classifier), pad=False, bf16=name.endswith("bf16"))
    if any(n.startswith(("onnx", "openvino")) for n in names):
        fp32 = onnx_bytes(classifier)
        static = quantize_static_int8(fp32, calibration, reduce_range=reduce_range_for())
        made = {"onnx": lambda: OnnxClassifier(fp32, threads), "onnx-int8": lambda: OnnxClassifier(static, threads),
                "onnx-int8 dynamic": lambda: OnnxClassifier(quantize_dynamic_int8(fp32), threads),
                "openvino": lambda: OpenVinoClassifier(fp32, threads),
                "openvino-bf16": lambda: OpenVinoClassifier(fp32, threads, bf16=True),
                "openvino-int8": lambda: OpenVinoClassifier(static, threads)}
        runners |= {name: make() for name, make in made.items() if name in names}
    return runners


class AutoRunner:
    """`--backend auto`'s procedure (`vit.deploy.auto`) on the runners built here: for each batch size timed it
    measures its candidates on 16 of the images within ``budget_s`` and keeps the fastest within tolerance of the
    first (the reference); a batch of another size runs the choice of the nearest size measured. The runners are
    built already, so build time does not count: a server's choice (no workload)."""

    def __init__(self, runners: dict[str, Runner], names: Sequence[str], sample: Tensor, sizes: Sequence[int],
                 budget_s: float) -> None:
        self.runners = runners
        self.results = {b: auto.measure(names, runners.__getitem__, sample, b, budget_s=budget_s,
                                        say=lambda line: print(line, file=sys.stderr, flush=True)) for b in sizes}
        self.chosen = {b: auto.choose(results) for b, results in self.results.items()}

    def __call__(self, images: Tensor) -> Tensor:
        size = min(self.chosen, key=lambda b: abs(b - len(images)))
        return self.runners[self.chosen[size]](images)


def add_auto(runners: dict[str, Runner], sample: Tensor, sizes: Sequence[int], budget_s: float) -> None:
    """An auto row per candidate set of `AUTO_SETS` that has at least two runners here."""
    for row, names in AUTO_SETS.items():
        present = [n for n in names if n in runners]
        if len(present) >= 2 and present[0] == names[0]:
            runners[row] = AutoRunner(runners, present, sample, sizes, budget_s)


def predict_all(run: Runner, images: Tensor, batch_size: int) -> Tensor:
    """Logits of all images, batch by batch."""
    return torch.cat([run(images[i:i + batch_size]) for i in range(0, len(images), batch_size)])


def timings(runners: dict[str, Runner], images: Tensor, batch_size: int, runs: int, min_seconds: float
            ) -> dict[str, list[float]]:
    """img/s of each runner over ``images`` at ``batch_size``, ``runs`` times, in alternating order. A timing is
    as many passes as make that runner take ``min_seconds``: short timings measure a shared machine's noise (with
    the passes set by eager's time, a runner 3x faster than eager was timed for a third as long)."""
    passes = {}
    for name, run in runners.items():  # warm-up (compiles, first-call allocations), then one timed pass
        predict_all(run, images[:batch_size], batch_size)
        start = time.perf_counter()
        predict_all(run, images, batch_size)
        passes[name] = max(1, math.ceil(min_seconds / (time.perf_counter() - start)))
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for r in range(runs):
        for name in names if r % 2 == 0 else names[::-1]:  # alternate who goes first
            start = time.perf_counter()
            for _ in range(passes[name]):
                predict_all(runners[name], images, batch_size)
            seconds[name].append((time.perf_counter() - start) / passes[name])
        print(f"  batch {batch_size}, run {r + 1}/{runs} ({passes[REFERENCE]} passes of eager): "
              + ", ".join(f"{n} {len(images) / s[-1]:.1f}" for n, s in seconds.items()) + " img/s",
              file=sys.stderr, flush=True)
    return {name: [len(images) / s for s in secs] for name, secs in seconds.items()}


def top1_margins(logits: Tensor) -> Tensor:
    """How far each image's top-1 logit is above its runner-up: how much change its answer can stand."""
    top = logits.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


def flipped_margins(reference: Tensor, logits: Tensor) -> list[float]:
    """The reference's top-1 margins of the images whose top-1 ``logits`` changes, smallest first: near-zero
    margins are ties, which any rounding may break either way."""
    changed = logits.argmax(-1) != reference.argmax(-1)
    return sorted(top1_margins(reference)[changed].tolist())


def benchmark(runners: dict[str, Runner], images: Tensor, labels: Tensor | None, batch_size: int, runs: int,
              min_seconds: float = 1.0, batches: Sequence[int] | None = None) -> list[dict]:
    """One row per backend: median img/s at batch 1 and ``batch_size``, ratios to eager, agreement, accuracy."""
    outputs = {name: predict_all(run, images, batch_size) for name, run in runners.items()}
    reference = outputs[REFERENCE]
    speed = {b: timings(runners, images, b, runs, min_seconds) for b in dict.fromkeys(batches or (1, batch_size))}
    rows = []
    for name in runners:
        predicted = outputs[name].argmax(-1)
        row = {"backend": name, "exact": name in EXACT,
               "max_abs_diff": (outputs[name] - reference).abs().max().item(),
               "agree_fp32": (predicted == reference.argmax(-1)).float().mean().item(),
               "agreement": (predicted == reference.argmax(-1)).float().mean().item(),  # the same: its common name
               "flipped_margins": flipped_margins(reference, outputs[name]),
               "top1": None if labels is None else (predicted == labels).float().mean().item()}
        if name == REFERENCE:  # the scale against which a changed answer's margin reads
            row["median_margin"] = top1_margins(reference).median().item()
        if isinstance(runners[name], AutoRunner):
            row["chosen"] = {f"b{b}": c for b, c in runners[name].chosen.items()}
        for b, ips in speed.items():
            row[f"img_s_b{b}"] = statistics.median(ips[name])
            row[f"ratio_b{b}"] = statistics.median(i / e for i, e in zip(ips[name], ips[REFERENCE]))
            if isinstance(runners[name], AutoRunner):  # against its choice's own row, run by run
                mine = ips[runners[name].chosen[b]]
                row[f"vs_chosen_b{b}"] = statistics.median(i / c for i, c in zip(ips[name], mine))
        rows.append(row)
    return rows


def fastest(rows: list[dict], batch_size: int) -> dict[str, str | None]:
    """The fastest exact backend, and the fastest within tolerance (agreement >= 99%, accuracy within 0.5 points)."""
    eager = next(r for r in rows if r["backend"] == REFERENCE)

    def within(r: dict) -> bool:
        accurate = r["top1"] is None or r["top1"] >= eager["top1"] - 0.005
        return r["agree_fp32"] >= 0.99 and accurate

    key = f"img_s_b{batch_size}"
    exact = [r for r in rows if r["exact"] and r["max_abs_diff"] <= EXACT_TOLERANCE]
    close = [r for r in rows if within(r)]
    return {"exact": max(exact, key=lambda r: r[key])["backend"] if exact else None,
            "within_tolerance": max(close, key=lambda r: r[key])["backend"] if close else None}


# ---- against the machine: each row's FLOP/s beside a GEMM's, timed in the same run --------------------------
def gemm_peaks(threads: int, n: int = 1024, seconds: float = 1.0) -> dict[str, float]:
    """GFLOP/s (GOP/s for int8) of an n x n x n matrix product on this CPU with ``threads``: fp32 and bf16
    (torch.mm: oneDNN/MKL, AMX or AVX512-BF16 where present) and int8 (torch._int_mm, VNNI where present): the
    measured roofs each backend's rows are read against (the best of three timings)."""
    torch.set_num_threads(threads)
    best = {}
    kinds = {"fp32": (torch.float32, torch.mm), "bf16": (torch.bfloat16, torch.mm), "int8": (torch.int8, torch._int_mm)}
    for kind, (dtype, mm) in kinds.items():
        if kind == "bf16" and not has_native_bf16():
            continue
        a = (torch.randn(n, n) * 10).to(dtype)
        b = (torch.randn(n, n) * 10).to(dtype)
        mm(a, b)
        rates = []
        for _ in range(3):
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / 3:
                mm(a, b)
                count += 1
            rates.append(2 * n ** 3 * count / (time.perf_counter() - start) / 1e9)
        best[kind] = max(rates)
    return best


def model_gflops(classifier: Classifier) -> float:
    """GFLOP of one image through the model (torch's FLOP counter: matmuls and convolutions, 2 per multiply-add)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        classifier(torch.zeros(1, classifier.in_chans, *classifier.img_size))
    return counter.get_total_flops() / 1e9


def precision_of(row: dict) -> str:
    """Which GEMM roof a row is read against: int8, bf16 or fp32 (an auto row: that of its choice at batch 8)."""
    name = " ".join([row["backend"], *row.get("chosen", {}).values()])
    return "int8" if "int8" in name else "bf16" if "bf16" in name else "fp32"


def add_peaks(rows: list[dict], gflops: float, peaks: dict[str, float], batches: Sequence[int]) -> None:
    for row in rows:
        kind = precision_of(row)
        row["gemm_roof"] = kind
        for b in batches:
            row[f"gflop_s_b{b}"] = row[f"img_s_b{b}"] * gflops
            row[f"peak_fraction_b{b}"] = row[f"gflop_s_b{b}"] / peaks[kind] if kind in peaks else None


def print_auto(rows: list[dict], batches: Sequence[int]) -> None:
    """Each auto row against the fastest backend within tolerance of its own set, and of every row."""
    by_name = {r["backend"]: r for r in rows}
    fixed = [r for r in rows if "chosen" not in r and r["agree_fp32"] >= 0.99]
    for name, names in AUTO_SETS.items():
        if name not in by_name:
            continue
        for b in batches:
            # within tolerance of eager: an int8 file's set may have none (its own reference is onnxruntime int8)
            own = max((by_name[n] for n in names if n in by_name and by_name[n] in fixed),
                      key=lambda r: r[f"img_s_b{b}"], default=None)
            best = max(fixed, key=lambda r: r[f"img_s_b{b}"])
            speed = by_name[name][f"img_s_b{b}"]
            mine = by_name[name]
            against = "none of its set is within tolerance of eager" if own is None else \
                f"{speed / own[f'img_s_b{b}']:.2f}x the fastest of its set within tolerance ({own['backend']})"
            print(f"{name} at batch {b}: chose {mine['chosen'][f'b{b}']} ({mine[f'vs_chosen_b{b}']:.2f}x "
                  f"its row, median of the runs' ratios), {against}, {speed / best[f'img_s_b{b}']:.2f}x the fastest "
                  f"row within tolerance ({best['backend']})")


ABLATION = {"kept: patch_embed, head, attention": KEEP_FP32, "int8 patch_embed too": ("head", "attention"),
            "int8 head too": ("patch_embed", "attention"), "int8 attention products too": ("patch_embed", "head"),
            "int8 all three": ()}


def int8_ablation(classifier: Classifier, images: Tensor, labels: Tensor | None, calibration: Tensor, threads: int,
                  batch_size: int, runs: int, min_seconds: float) -> list[dict]:
    """Static int8 with each of the usual fp32 layers quantised as well: agreement, accuracy and speed, per engine."""
    fp32 = onnx_bytes(classifier)
    runners: dict[str, Runner] = {REFERENCE: torch.inference_mode()(lambda x: classifier(x).float())}
    for name, keep in ABLATION.items():
        data = quantize_static_int8(fp32, calibration, reduce_range=reduce_range_for(), keep_fp32=keep)
        runners[f"onnx-int8, {name}"] = OnnxClassifier(data, threads)
        try:
            runners[f"openvino-int8, {name}"] = OpenVinoClassifier(data, threads)
        except RuntimeError as e:  # OpenVINO 2026.4 failed to compile some QDQ placements: say so, go on
            print(f"openvino-int8, {name}: OpenVINO could not compile it ({str(e).splitlines()[0][:100]})")
    return benchmark(runners, images, labels, batch_size, runs, min_seconds, batches=(batch_size,))


def print_table(rows: list[dict], batches: Sequence[int]) -> None:
    """The rows as a Markdown table."""
    b = batches[-1]
    roof = f"peak_fraction_b{b}" in rows[0]
    speeds = "".join(f" img/s b{b} |" for b in batches) + "".join(f" vs eager b{b} |" for b in batches)
    speeds += f" GFLOP/s b{b} | of its GEMM roof b{b} |" if roof else ""
    print(f"| backend |{speeds} max \\|logit diff\\| | same top-1 | test top-1 |")
    print("| --- |" + " ---: |" * (2 * len(batches) + 3 + 2 * roof))
    for r in rows:
        top1 = "n/a" if r["top1"] is None else f"{r['top1']:.4f}"
        cells = [f"{r[f'img_s_b{b}']:.1f}" for b in batches] + [f"{r[f'ratio_b{b}']:.2f}x" for b in batches]
        if roof:
            fraction = r[f"peak_fraction_b{b}"]
            cells += [f"{r[f'gflop_s_b{b}']:.0f}", "n/a" if fraction is None else f"{fraction:.0%} ({r['gemm_roof']})"]
        print(f"| {r['backend']} | {' | '.join(cells)} | {r['max_abs_diff']:.1e} | {r['agree_fp32']:.4f} | {top1} |")


def print_flips(rows: list[dict], images: int) -> None:
    """Where a backend changed a top-1, how close eager's answer was to a tie there."""
    median = next(r for r in rows if r["backend"] == REFERENCE)["median_margin"]
    for r in rows:
        if r["flipped_margins"]:
            margins = ", ".join(f"{m:.4f}" for m in r["flipped_margins"])
            print(f"{r['backend']}: top-1 changed on {len(r['flipped_margins'])} of {images} images, where eager's "
                  f"top-1 led its runner-up by {margins} (median over the images: {median:.4f})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ckpt", help="a `vit fit` checkpoint (with --config): accuracy on its test split")
    source.add_argument("--model", choices=vit.list_models(), help="random weights, synthetic images: timing only")
    parser.add_argument("--config", help="with --ckpt: the `vit fit` config it was trained with (its data)")
    parser.add_argument("--root", help="with --config: the data folder (--data.init_args.root)")
    parser.add_argument("--num_classes", type=int, default=1000, help="with --model (default: %(default)s)")
    parser.add_argument("--images", type=int, default=16, help="synthetic images with --model (default: %(default)s)")
    parser.add_argument("--batch_size", type=int, default=8, help="the larger batch timed (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="timings per backend and batch (default: %(default)s)")
    parser.add_argument("--min_seconds", type=float, default=1.0,
                        help="a timing repeats passes over the images for at least this long (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch, onnxruntime and OpenVINO threads "
                        "(default: %(default)s)")
    parser.add_argument("--compile", action="store_true", help="also time torch-compile (about a minute's compile "
                        "for ViT-S/16)")
    parser.add_argument("--skip", nargs="+", default=[], choices=[b for b in BACKENDS if b != REFERENCE],
                        metavar="BACKEND", help="backends to leave out")
    parser.add_argument("--int8_ablation", action="store_true",
                        help="instead: static int8 with the patch embedding, the head or the attention products "
                        "quantised too, to see what keeping them in fp32 is worth")
    parser.add_argument("--calibration_seed", type=int, default=0, help="with --ckpt: which random draw of "
                        "training images calibrates static int8 (default: %(default)s, as `vit export` draws)")
    parser.add_argument("--auto_budget", type=float, default=15.0, help="seconds for each `--backend auto` "
                        "measurement (a row per candidate set, per batch size; 0: no auto rows; default: %(default)s)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.ckpt and not args.config:
        parser.error("--ckpt needs --config: the `vit fit` config it was trained with (its test and training data)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)

    torch.set_num_threads(args.threads)
    if args.ckpt:
        classifier = load_classifier(args.ckpt)
        images, labels, calibration = config_splits(args.config, args.root, CALIBRATION_IMAGES, classifier,
                                                    args.calibration_seed)
    else:
        classifier = random_classifier(args.model, args.num_classes)
        generator = torch.Generator().manual_seed(0)
        images = torch.randn(args.images, classifier.in_chans, *classifier.img_size, generator=generator)
        calibration = torch.randn(32, classifier.in_chans, *classifier.img_size, generator=generator)
        labels = None
    names = [b for b in BACKENDS if b not in args.skip and (args.compile or not b.startswith("torch-compile"))]
    if not has_native_bf16():
        names = [b for b in names if "bf16" not in b]  # emulated: many times slower, refused by `vit predict`
    cpu = describe_cpu()
    print(f"{classifier.model_name}, {len(images)} images, batches 1 and {args.batch_size}, {args.threads} thread(s), "
          f"torch {torch.__version__}, {platform.processor() or platform.machine()}, CPU flags: {cpu}", flush=True)
    if args.int8_ablation:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows = int8_ablation(classifier, images, labels, calibration, args.threads, args.batch_size, args.runs,
                                 args.min_seconds)
        print_table(rows, [args.batch_size])
        print_flips(rows, len(images))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"model": classifier.model_name, "cpu_flags": cpu, "rows": rows}, f, indent=2)
        return {"rows": rows}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's warnings
        runners = build_runners(classifier, calibration, args.threads, names)
        batches = list(dict.fromkeys((1, args.batch_size)))
        if args.auto_budget > 0:
            add_auto(runners, images[:auto.SAMPLE_IMAGES], batches, args.auto_budget)
        rows = benchmark(runners, images, labels, args.batch_size, args.runs, args.min_seconds)
    peaks, gflops = gemm_peaks(args.threads), model_gflops(classifier)
    add_peaks(rows, gflops, peaks, batches)
    print_table(rows, batches)
    print_flips(rows, len(images))
    print_auto(rows, batches)
    print(f"{gflops:.2f} GFLOP an image; GEMM roofs measured here ({args.threads} threads): "
          + ", ".join(f"{k} {v:.0f} G{'OP' if k == 'int8' else 'FLOP'}/s" for k, v in peaks.items()))
    best = fastest(rows, args.batch_size)
    print(f"fastest exact (<= {EXACT_TOLERANCE:g}): {best['exact']}; fastest within tolerance (same top-1 >= 99%, "
          f"test top-1 within 0.5 points): {best['within_tolerance']} (batch {args.batch_size})")
    result = {"model": classifier.model_name, "images": len(images), "batch_size": args.batch_size,
              "threads": args.threads, "calibration_seed": args.calibration_seed, "torch": torch.__version__,
              "cpu_flags": cpu, "gflop_per_image": gflops, "gemm_peaks": peaks, "rows": rows, "fastest": best}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
