"""`--backend auto`: time the backends that can run a model file on a few of its own images, drop those that
change its answers, keep the fastest, and remember the choice beside the file.

The measurement, per candidate (the reference first: eager fp32 for a checkpoint, onnxruntime for an ONNX file):
build it, run one warm-up batch and the images at the batch size; then all built candidates are timed in
alternation, `ROUNDS` timings each, their median kept, within the time budget (`BUDGET_S` in all, builds included,
said on a progress line). A candidate is dropped when its top-1 agrees with the
reference's on fewer than `MIN_AGREEMENT` of the images, or when any softmax probability differs from the
reference's by more than `PROB_TOLERANCE`. Of the rest, the chosen one finishes the job soonest: its build
seconds plus ``workload`` images at its measured speed (``workload=None``: a server's endless stream, so the
fastest per image).

The measurements are cached in ``<file>.backends.json`` beside the model (or under ``~/.cache/vit/backends`` when
that folder is not writable), keyed by the file's SHA-256, the CPU's flags, the thread count and the batch size:
a second run with the same key builds the choice without timing anything. This module knows no backend: the
caller (`vit.deploy.backends.load_classifier`) hands it the names and a function that builds each.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

BUDGET_S = 30.0  # the whole measurement: builds, warm-ups and timings
MIN_AGREEMENT = 0.99  # top-1 agreement with the reference on the sample images
PROB_TOLERANCE = 0.05  # largest |softmax difference| from the reference, any image, any class
SAMPLE_IMAGES = 16
ROUNDS = 3  # timings per candidate, in alternation (`time_alternating`)
TIMED_BATCH = 16  # a larger batch is timed at 16: a CPU's img/s barely moves past it, and the budget holds
CACHE_VERSION = 1

Model = Callable[[Tensor], Tensor]


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file (a checkpoint or an export)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def cache_key(digest: str, flags: str, threads: int, batch_size: int) -> str:
    """What a measurement depends on: the file, the CPU's instruction sets, the threads and the batch size."""
    return f"{digest[:16]}|{flags}|threads={threads}|batch={batch_size}"


def cache_file(path: str | os.PathLike) -> Path:
    """``<file>.backends.json`` beside the model, or a file under ~/.cache/vit/backends if that folder is read-only."""
    beside = Path(str(path) + ".backends.json")
    if os.access(beside.parent, os.W_OK):
        return beside
    name = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:16]
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "vit", "backends", name + ".json")


def read_cache(file: Path, key: str) -> dict | None:
    """The measurements stored for ``key``, or None (no file, another key, or an unreadable file: measure again)."""
    with contextlib.suppress(OSError, ValueError):
        stored = json.loads(file.read_text())
        if stored.get("version") == CACHE_VERSION:
            return stored.get("entries", {}).get(key)
    return None


def write_cache(file: Path, key: str, entry: dict) -> None:
    """Add ``entry`` under ``key``, keeping the others (another batch size, another CPU sharing the folder)."""
    stored: dict[str, Any] = {"version": CACHE_VERSION, "entries": {}}
    with contextlib.suppress(OSError, ValueError):
        old = json.loads(file.read_text())
        if old.get("version") == CACHE_VERSION:
            stored = old
    stored["entries"][key] = entry
    with contextlib.suppress(OSError):  # a cache that cannot be written costs a measurement next time, no more
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(file.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(stored, indent=1))
        tmp.replace(file)


def batches(images: Tensor, batch_size: int) -> list[Tensor]:
    """Full batches of ``images`` (repeated to make at least one): a timing of the batch size asked for."""
    if len(images) < batch_size:
        images = images.repeat(math.ceil(batch_size / len(images)), 1, 1, 1)
    whole = len(images) // batch_size * batch_size
    return [images[i:i + batch_size] for i in range(0, whole, batch_size)]


@torch.inference_mode()
def logits_of(model: Model, parts: Sequence[Tensor]) -> Tensor:
    return torch.cat([model(b).float() for b in parts])


def compare(reference: Tensor, logits: Tensor) -> dict[str, float]:
    """Top-1 agreement and the largest softmax difference of ``logits`` against ``reference``'s."""
    agreement = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
    prob_diff = (logits.softmax(-1) - reference.softmax(-1)).abs().max().item()
    return {"agreement": round(agreement, 4), "max_prob_diff": round(prob_diff, 5)}


def time_model(model: Model, parts: Sequence[Tensor], seconds: float) -> float:
    """img/s: passes over ``parts`` for about ``seconds`` (at least one), after the warm-up the caller ran."""
    images, passes, start = sum(len(b) for b in parts), 0, time.perf_counter()
    with torch.inference_mode():
        while True:
            for b in parts:
                model(b)
            passes += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return images * passes / elapsed


def measure(names: Sequence[str], build: Callable[[str], Model], images: Tensor, batch_size: int, *,
            budget_s: float = BUDGET_S, say: Callable[[str], None] | None = None) -> dict[str, dict]:
    """Each candidate's build seconds, img/s, agreement and probability difference; ``names[0]`` is the reference.

    Each is built and checked in turn, then all are timed in alternation (`time_alternating`). A candidate that
    fails to build or run is recorded with its error; one left when the budget is spent is recorded as not
    measured. Both are never chosen."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    parts = batches(images, min(batch_size, TIMED_BATCH))
    timed = f"{min(batch_size, TIMED_BATCH)}" + (f" (for batch {batch_size})" if batch_size > TIMED_BATCH else "")
    say(f"--backend auto: timing {len(names)} backends ({', '.join(names)}) on {len(images)} images at batch "
        f"{timed}, within {budget_s:.0f} s; the choice is cached for the next run")
    deadline, results, reference, models = time.perf_counter() + budget_s, {}, None, {}
    for name in names:
        if deadline - time.perf_counter() <= 0 and reference is not None:
            results[name] = {"error": "not measured: the time budget was spent"}
            continue
        try:
            start = time.perf_counter()
            model = build(name)
            logits = logits_of(model, parts[:1])  # the warm-up batch (and first-call compiles), part of the build
            build_s = time.perf_counter() - start + getattr(model, "build_extra_s", 0.0)  # what it shared
            logits = torch.cat([logits, logits_of(model, parts[1:])]) if len(parts) > 1 else logits
        except Exception as e:  # a backend that cannot run here is one the choice skips, with why
            results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
            say(f"  {name}: failed ({results[name]['error']})")
            continue
        reference = logits if reference is None else reference
        results[name] = {"build_s": round(build_s, 3), **compare(reference, logits)}
        models[name] = model
    for name, img_s in time_alternating(models, parts, deadline).items():
        r = results[name]
        r["img_s"] = round(img_s, 2)
        say(f"  {name}: {img_s:.1f} img/s, built in {r['build_s']:.1f} s, top-1 agreement {r['agreement']:.3f}, "
            f"max probability difference {r['max_prob_diff']:.4f}")
    return results


def time_alternating(models: dict[str, Model], parts: Sequence[Tensor], deadline: float) -> dict[str, float]:
    """Median img/s of each model over `ROUNDS` rounds, each model timed in turn in every round (the order reversed
    every other round), in the time left before ``deadline`` (at least one pass each). Timed one after another,
    a tiny model's onnxruntime ran at 2,656 img/s in auto's measurement and 4,728 beside the others, 0.66x what
    auto then got (docs/speed.md): a busy moment now slows one round of all, not one candidate."""
    names, speeds = list(models), {name: [] for name in models}
    for r in range(ROUNDS):
        for name in names if r % 2 == 0 else names[::-1]:
            share = (deadline - time.perf_counter()) / ((ROUNDS - r) * len(names)) - 0.1
            speeds[name].append(time_model(models[name], parts, min(max(share, 0.0), 5.0 / ROUNDS)))
    return {name: statistics.median(s) for name, s in speeds.items()}


def acceptable(result: dict) -> bool:
    """Measured, and within the agreement and probability tolerances."""
    return ("img_s" in result and result["agreement"] >= MIN_AGREEMENT
            and result["max_prob_diff"] <= PROB_TOLERANCE)


def choose(results: dict[str, dict], workload: int | None = None) -> str:
    """The acceptable backend that finishes ``workload`` images soonest (build + images / speed); None: the fastest
    per image. The reference (the first) is always acceptable against itself."""
    def cost(name: str) -> float:
        r = results[name]
        return r["build_s"] * (workload is not None) + (workload or 1) / r["img_s"]

    ok = [name for name, r in results.items() if acceptable(r)]
    if not ok:
        raise RuntimeError("--backend auto: no backend ran; " + "; ".join(
            f"{name}: {r.get('error', 'outside tolerance')}" for name, r in results.items()))
    return min(ok, key=cost)


def synthetic_images(shape: Sequence[int], count: int = SAMPLE_IMAGES) -> Tensor:
    """Seeded noise images (N, C, H, W), for when a run has none of its own (`vit serve`, the Python API)."""
    return torch.randn(count, *shape, generator=torch.Generator().manual_seed(0))


def auto_choice(file: str | os.PathLike, names: Sequence[str], build: Callable[[str], Model],
                images: Callable[[Model], Tensor], *, flags: str, threads: int, batch_size: int,
                workload: int | None = None, budget_s: float = BUDGET_S, use_cache: bool = True,
                say: Callable[[str], None] | None = None) -> tuple[Model, dict]:
    """The chosen model and what chose it: ``{"backend", "cached", "cache", "key", "results"}``.

    ``images(reference_model)`` gives the sample images (called only when measuring). The reference model built to
    measure is reused when it is the choice."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    store, key = cache_file(file), cache_key(file_digest(file), flags, threads, batch_size)
    entry = read_cache(store, key) if use_cache else None
    cached = entry is not None and set(names) <= set(entry["results"])
    if cached:
        results = entry["results"]
    else:
        built: dict[str, Model] = {}

        def build_once(name: str) -> Model:
            built[name] = build(name) if name not in built else built[name]
            return built[name]

        sample = images(build_once(names[0]))
        results = measure(names, build_once, sample, batch_size, budget_s=budget_s, say=say)
        write_cache(store, key, {"results": results, "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
                                 "images": len(sample), "candidates": list(names)})
    results = {n: results[n] for n in names}
    backend = choose(results, workload)
    model = built[backend] if not cached and backend in built else build(backend)
    say(f"--backend auto: {backend} ({'cached in' if cached else 'measured; cached in'} {store})")
    return model, {"backend": backend, "cached": cached, "cache": str(store), "key": key, "results": results}
