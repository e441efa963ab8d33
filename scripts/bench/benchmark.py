"""Throughput of our ViT against timm's, side by side in one process.

For a named config both models are built from the same config dict with the same weights,
then timed in alternation (ours, timm, timm, ours, ...) so that a noisy, shared machine
hurts both equally. Each row reports the median images/s of several runs, the median of
the paired ratios ours/timm, the achieved GFLOP/s (FLOPs counted by torch) and the MFU: that rate over
the matrix-multiply peak measured in the same run (a large square matmul in the row's precision).

    python scripts/bench/benchmark.py                                  # vit_small_patch16_224, batch 32
    python scripts/bench/benchmark.py --model vit_base_patch16_224 --batch_size 16 --runs 9
    python scripts/bench/benchmark.py --precision bf16 --mode train --json bench.json
    python scripts/bench/benchmark.py --device cuda --model vit_base_patch16_224 --batch_size 256 --compile
    python scripts/bench/benchmark.py --families --img_size 224 --batch_size 8 --precision fp32   # one model a family
    python scripts/bench/benchmark.py --clip ViT-B-32 --precision fp32 --mode infer   # encode_text/_image vs open_clip

``--clip NAME`` times our CLIP against open_clip's (a dev dependency) instead: the same random weights, loaded
by `vit.checkpoints.clip.load_clip` from an OpenCLIP folder written here, ``encode_text`` on a batch of short
prompts ("a photo of a {}.", what zero-shot encodes) and of full-context texts (77 tokens, no padding to skip),
and ``encode_image``; inference only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import vit
from vit.checkpoints.convert import to_timm_names
from vit.nn.vision import MODEL_CONFIGS

# One model of each family (`--families`): the classic ViT, DINOv2, DINOv2 + registers, DINOv3 (rotary),
# CLIP, SigLIP (attention pool), DeiT III, DeiT distilled.
FAMILY_MODELS = ["vit_small_patch16_224", "vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2",
                 "vit_small_patch16_dinov3", "vit_base_patch16_clip_224", "vit_base_patch16_siglip_224",
                 "deit3_small_patch16_224", "deit_small_distilled_patch16_224"]


def build_pair(
    name: str, batch_size: int, device: str = "cpu", img_size: int | None = None
) -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    """Our model and timm's (``timm.create_model`` of the same name), with identical weights.

    Our configs that timm has no name for (digits, CIFAR) are built on timm's VisionTransformer from the same
    fields. 10 classes, so that a training step has labels for every family (some default to no head)."""
    options = {"num_classes": 10, **({"img_size": img_size} if img_size else {})}
    torch.manual_seed(0)
    if timm.is_model(name):
        theirs = timm.create_model(name, pretrained=False, **options)
    else:
        theirs = timm.models.vision_transformer.VisionTransformer(**{**MODEL_CONFIGS[name], **options})
    ours = vit.create_model(name, **options)
    ours.load_state_dict(to_timm_names(theirs.state_dict()), strict=True)
    images = torch.randn(batch_size, ours.in_chans, *ours.img_size, device=device)
    return ours.to(device), theirs.to(device), images


def autocast(precision: str, device_type: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_step(model: torch.nn.Module, images: torch.Tensor, mode: str, precision: str) -> Callable[[], None]:
    """One inference forward, or one training step (forward, backward, AdamW)."""
    if mode == "infer":
        model.eval()

        def step() -> None:
            with torch.inference_mode(), autocast(precision, images.device.type):
                model(images)

        return step

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    labels = torch.randint(0, model.num_classes, (images.shape[0],), device=images.device)

    def step() -> None:
        with autocast(precision, images.device.type):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def count_flops(model: torch.nn.Module, images: torch.Tensor, mode: str, precision: str) -> int:
    """FLOPs of one step as torch counts them (matmuls, convolutions, attention)."""
    counter = FlopCounterMode(display=False)
    with counter, autocast(precision, images.device.type):
        out = model(images)
        if mode == "train":
            out.float().sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def sync(device: torch.device) -> None:
    if device.type == "cuda":  # kernels run asynchronously: wait for them before reading the clock
        torch.cuda.synchronize(device)


def time_it(step: Callable[[], None], iters: int, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        step()
    sync(device)
    return (time.perf_counter() - start) / iters


def matmul_peak(precision: str, device: str = "cpu", size: int | None = None, repeats: int = 3) -> float:
    """GFLOP/s of the fastest of ``repeats`` large square matmuls in ``precision``: the MFU's denominator.

    Both layouts are timed, ``a @ b`` and ``F.linear(a, b)`` (a @ bᵀ, what every Linear computes): on a CPU
    without bf16 units torch 2.14 runs bf16 ``mm`` about 7x slower than bf16 ``linear``, so ``a @ b`` alone
    would understate the peak there.
    """
    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 1024)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    best = math.inf
    for step in (lambda: a @ b, lambda: F.linear(a, b)):
        step()  # warm-up: kernels chosen, memory touched
        best = min(best, *(time_it(step, 1, device) for _ in range(repeats)))
    return 2 * size**3 / best / 1e9


def benchmark_row(name: str, batch_size: int, mode: str, precision: str, runs: int, iters: int,
                  warmup: int, device: str = "cpu", compile: bool = False, peak_gflop_s: float | None = None,
                  img_size: int | None = None) -> dict:
    ours, theirs, images = build_pair(name, batch_size, device, img_size)
    # With --compile both models are compiled alike; the warm-up pays the compile time.
    wrap = torch.compile if compile else (lambda m: m)
    steps = {
        "ours": make_step(wrap(ours), images, mode, precision),
        "timm": make_step(wrap(theirs), images, mode, precision),
    }
    for step in steps.values():
        for _ in range(warmup):
            step()
    seconds: dict[str, list[float]] = {"ours": [], "timm": []}
    for run in range(runs):
        order = ("ours", "timm") if run % 2 == 0 else ("timm", "ours")  # alternate who goes first
        for who in order:
            seconds[who].append(time_it(steps[who], iters, images.device))
        ours_ips, timm_ips = batch_size / seconds["ours"][-1], batch_size / seconds["timm"][-1]
        print(f"  {mode:5s} {precision:4s} run {run + 1}/{runs}: ours {ours_ips:8.1f} img/s, "
              f"timm {timm_ips:8.1f} img/s", file=sys.stderr, flush=True)
    ips = {who: [batch_size / s for s in secs] for who, secs in seconds.items()}
    ratios = [o / t for o, t in zip(ips["ours"], ips["timm"])]
    flops = {who: count_flops(m, images, mode, precision) for who, m in (("ours", ours), ("timm", theirs))}
    median_s = {who: statistics.median(secs) for who, secs in seconds.items()}
    gflop_s = {who: flops[who] / median_s[who] / 1e9 for who in flops}
    peak = peak_gflop_s or matmul_peak(precision, device)
    return {
        "model": name,
        "img_size": list(ours.img_size),
        "batch_size": batch_size,
        "mode": mode,
        "precision": precision,
        "ours_img_s": statistics.median(ips["ours"]),
        "timm_img_s": statistics.median(ips["timm"]),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ours_gflop_s": gflop_s["ours"],
        "timm_gflop_s": gflop_s["timm"],
        "peak_gflop_s": peak,
        "ours_mfu": gflop_s["ours"] / peak,
        "timm_mfu": gflop_s["timm"] / peak,
        "ours_gflop_per_step": flops["ours"] / 1e9,
        "timm_gflop_per_step": flops["timm"] / 1e9,
        "runs": runs,
        "iters_per_run": iters,
        "device": str(images.device),
        "compiled": compile,
    }


def clip_pair(name: str, folder: Path, device: str) -> tuple[torch.nn.Module, torch.nn.Module, Callable]:
    """open_clip's random ``name`` and ours loaded from its files (written to ``folder``), and its tokenizer."""
    import open_clip
    from open_clip.tokenizer import SimpleTokenizer
    from safetensors.torch import save_file

    from vit.checkpoints.clip import load_clip

    torch.manual_seed(0)
    theirs = open_clip.create_model(name, pretrained=None).eval()
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, folder / "open_clip_model.safetensors")
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": open_clip.get_model_config(name)}))
    tok = SimpleTokenizer()
    (folder / "vocab.json").write_text(json.dumps(tok.encoder))
    ranks = sorted(tok.bpe_ranks.items(), key=lambda kv: kv[1])
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for (a, b), _ in ranks))
    ours = load_clip(folder).model.eval()
    return ours.to(device), theirs.to(device), open_clip.get_tokenizer(name)


def inference_step(fn: Callable, inputs: torch.Tensor, precision: str) -> Callable[[], None]:
    def step() -> None:
        with torch.inference_mode(), autocast(precision, inputs.device.type):
            fn(inputs)

    return step


def clip_rows(name: str, batch_size: int, precision: str, runs: int, iters: int, warmup: int,
              device: str = "cpu") -> list[dict]:
    """Texts/s (images/s) of ``encode_text`` on short prompts and full-context texts, and of ``encode_image``."""
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs, tokenize = clip_pair(name, Path(tmp), device)
    words = ["oak", "maple", "birch", "tabby", "cat", "golden", "retriever", "red", "car", "old", "bridge", "boat"]
    prompts = tokenize([f"a photo of a {words[i % len(words)]}." for i in range(batch_size)]).to(device)
    full = tokenize([" ".join(words[(i + j) % len(words)] for j in range(90)) for i in range(batch_size)]).to(device)
    size = theirs.visual.image_size
    images = torch.randn(batch_size, 3, *((size, size) if isinstance(size, int) else size), device=device)
    cases = [("encode_text prompts", "encode_text", prompts), ("encode_text 77 tokens", "encode_text", full),
             ("encode_image", "encode_image", images)]
    rows = []
    for label, method, inputs in cases:
        steps = {who: inference_step(getattr(model, method), inputs, precision)
                 for who, model in (("ours", ours), ("open_clip", theirs))}
        for step in steps.values():
            for _ in range(warmup):
                step()
        seconds: dict[str, list[float]] = {"ours": [], "open_clip": []}
        for run in range(runs):
            for who in (("ours", "open_clip") if run % 2 == 0 else ("open_clip", "ours")):
                seconds[who].append(time_it(steps[who], iters, inputs.device))
        ratios = [t / o for o, t in zip(seconds["ours"], seconds["open_clip"])]
        rows.append({"model": name, "case": label, "batch_size": batch_size, "precision": precision,
                     "tokens": int(inputs.shape[1]) if method == "encode_text" else None,
                     "ours_per_s": batch_size / statistics.median(seconds["ours"]),
                     "open_clip_per_s": batch_size / statistics.median(seconds["open_clip"]),
                     "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "runs": runs, "iters_per_run": iters, "device": device})
        r = rows[-1]
        print(f"{name} {label:22s} {precision:4s} batch {batch_size}: ours {r['ours_per_s']:8.1f}/s, open_clip "
              f"{r['open_clip_per_s']:8.1f}/s, ours/open_clip {r['ratio_median']:.3f} "
              f"({r['ratio_min']:.3f}–{r['ratio_max']:.3f})", flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    header = (f"{'model':33s} {'mode':6s} {'precision':9s} {'ours img/s':>11s} {'timm img/s':>11s} {'ours/timm':>10s} "
              f"{'(min–max)':>13s} {'ours GFLOP/s':>13s} {'timm GFLOP/s':>13s} {'ours MFU':>9s} {'timm MFU':>9s}")
    print(header)
    print("-" * len(header))
    for r in rows:
        spread = f"{r['ratio_min']:.3f}–{r['ratio_max']:.3f}"
        print(f"{r['model']:33s} {r['mode']:6s} {r['precision']:9s} {r['ours_img_s']:11.1f} {r['timm_img_s']:11.1f} "
              f"{r['ratio_median']:10.3f} {spread:>13s} {r['ours_gflop_s']:13.1f} {r['timm_gflop_s']:13.1f} "
              f"{r['ours_mfu']:9.1%} {r['timm_mfu']:9.1%}")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", nargs="+", default=["vit_small_patch16_224"], choices=vit.list_models())
    parser.add_argument("--families", action="store_true", help=f"one model a family: {', '.join(FAMILY_MODELS)}")
    parser.add_argument("--img_size", type=int, default=None, help="input size (default: each model's own)")
    parser.add_argument("--batch_size", "--batch-size", type=int, default=32)
    parser.add_argument("--mode", nargs="+", default=["infer", "train"], choices=["infer", "train"])
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per model; the median is reported")
    parser.add_argument("--iters", type=int, default=2, help="steps per timed run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    parser.add_argument("--json", default="benchmark.json", help="where to write the results")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    parser.add_argument("--peak_size", type=int, default=None,
                        help="side of the square matmul that measures the peak (default: 1024 CPU, 8192 GPU)")
    parser.add_argument("--clip", default=None, metavar="NAME",
                        help="time our CLIP's encode_text/encode_image against open_clip's NAME (e.g. ViT-B-32)")
    args = parser.parse_args(argv)
    if args.clip:
        import open_clip

        print(f"{args.clip} vs open_clip {open_clip.__version__}, torch {torch.__version__}, {args.device}, "
              f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}", flush=True)
        rows = [row for precision in args.precision for row in clip_rows(
            args.clip, args.batch_size, precision, args.runs, args.iters, args.warmup, args.device)]
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "open_clip": open_clip.__version__,
                       "threads": torch.get_num_threads(), "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")
        return rows
    models = FAMILY_MODELS if args.families else args.model

    print(f"{', '.join(models)}, batch {args.batch_size}, {args.device}, torch {torch.__version__}, "
          f"timm {timm.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}", flush=True)
    peaks = {precision: matmul_peak(precision, args.device, args.peak_size) for precision in args.precision}
    print("matmul peak: " + ", ".join(f"{p} {g:.1f} GFLOP/s" for p, g in peaks.items()), flush=True)
    rows = [
        benchmark_row(model, args.batch_size, mode, precision, args.runs, args.iters,
                      max(args.warmup, 1 if args.compile else 0), args.device, args.compile, peaks[precision],
                      args.img_size)
        for model in models
        for precision in args.precision
        for mode in args.mode
    ]
    print_table(rows)
    with open(args.json, "w") as f:
        json.dump({"torch": torch.__version__, "timm": timm.__version__, "threads": torch.get_num_threads(),
                   "matmul_peak_gflop_s": peaks, "rows": rows}, f, indent=2)
    print(f"wrote {args.json}")
    return rows


if __name__ == "__main__":
    main()
