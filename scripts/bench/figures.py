"""The recipes' headline figures at reduced size, checked against a committed table (figures.json beside this file).

    python scripts/bench/figures.py                      # seed 0, every figure: about 3-4 minutes on 2 cores
    python scripts/bench/figures.py --only digits --seeds 0 1 2
    python scripts/bench/figures.py --only digits --override "digits:model.init_args.optim.lr=0.04"
    python scripts/bench/figures.py --record --seeds 0 1 2   # re-measure and rewrite the table

A figure moves with the environment (torch, the CPU's kernels), not only with the code, so the table holds per figure
the mean and std over 3 seeds and a tolerance, max(3 std, floor), and the package versions and CPU it was measured
on. Each run is `vit fit --config <recipe>` in its own process, with the reduced sizes the table states (the recipe's
own options otherwise); the figure is the test metric of its best checkpoint (``test_after_fit``). The measured value,
the mean over the seeds asked for, must lie within expected mean +- tolerance; exit 1 when one does not. Run it before
stopping whenever a change touches training; it is not in CI (minutes).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from importlib.metadata import version
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
TABLE = Path(__file__).with_name("figures.json")
PACKAGES = ("torch", "torchvision", "timm", "lightning", "torchmetrics", "numpy")
# the lscpu flags that pick torch's CPU kernels (and so move the last digits of a figure)
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
FLOOR = 0.02  # a tolerance never narrower than 2 points: 3 seeds estimate a std loosely
COMMON = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


class Figure(NamedTuple):
    """One headline figure: a recipe, its reduced options, the test metric read, and the data it needs built."""

    config: str
    metric: str
    options: list[str]
    data: Callable[[Path], list[str]] | None = None  # builds the data under a folder, returns the options naming it
    about: str = ""
    floor: float = FLOOR


def experiments() -> None:
    """scripts/experiments on sys.path: its folder builders are imported by name, as the scripts there do."""
    folder = str(ROOT / "scripts" / "experiments")
    if folder not in sys.path:
        sys.path.insert(0, folder)


def char_tsv(root: Path, n_train: int = 3000, n_test: int = 300, seed: int = 0) -> list[str]:
    """A character-level TSV task: a lowercase word -> each letter shifted by one ("abc" -> "bcd"). Deterministic; train
    and test words are distinct."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxy"  # z left out: its shift would wrap
    words: set[str] = set()
    while len(words) < n_train + n_test:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(3, 8))))
    ordered = sorted(words)
    rng.shuffle(ordered)
    pair = lambda w: f"{w}\t{''.join(chr(ord(c) + 1) for c in w)}\n"
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.tsv").write_text("".join(pair(w) for w in ordered[:n_train]))
    (root / "test.tsv").write_text("".join(pair(w) for w in ordered[n_train:]))
    return [f"--data.init_args.train={root / 'train.tsv'}", f"--data.init_args.test={root / 'test.tsv'}"]


def digit_folder(root: Path) -> list[str]:
    """scikit-learn's digits as 8x8 PNG class folders, split 1,151 / 287 / 359 (small_folders.py's digits)."""
    experiments()
    from small_folders import digits

    digits(root)
    return [f"--data.init_args.root={root}"]


def composites(root: Path) -> list[str]:
    """Multi-label digit composites (multilabel_digits.py's builder), 1,000 / 200 / 400."""
    experiments()
    from multilabel_digits import write_composites

    write_composites(root, {"train": 1000, "val": 200, "test": 400})
    return [f"--data.init_args.root={root}"]


FIGURES: dict[str, Figure] = {
    "digits": Figure(
        "digits.yaml", "test_acc", ["--trainer.max_epochs=25"],
        about="configs/digits.yaml, 25 epochs (not 60)"),
    "reverse": Figure(
        "translate_reverse.yaml", "test_exact_match",
        ["--trainer.max_steps=800", "--trainer.val_check_interval=400", "--data.init_args.num_train=16000",
         "--data.init_args.num_val=200", "--data.init_args.num_test=500"],
        about="configs/translate_reverse.yaml, 800 steps (not 2,000), validated every 400, 16,000 / 200 / 500 "
              "sequences"),
    "char_tsv": Figure(
        "translate_tsv.yaml", "test_exact_match",
        ["--test_after_fit=true", "--trainer.max_epochs=8", "--data.init_args.tokenizer=char",
         "--data.init_args.max_length=16", "--model.init_args.embed_dim=64", "--model.init_args.num_encoder_layers=2",
         "--model.init_args.num_decoder_layers=2", "--model.init_args.warmup_steps=300",
         "--checkpoint.monitor=val_exact_match", "--checkpoint.mode=max"],
        data=char_tsv,
        about="configs/translate_tsv.yaml on a generated char TSV (3,000 pairs, 5% val; 300 test): char tokens, "
              "dim 64, 2+2 layers, warm-up 300, 8 epochs, best by val_exact_match, tested"),
    "scratch_small": Figure(
        "scratch_small.yaml", "test_acc", ["--trainer.max_epochs=12", "--data.init_args.hflip=0"],
        data=digit_folder,
        about="configs/scratch_small.yaml on scikit-learn's digits as PNG folders (1,151 / 287 / 359), hflip 0, "
              "12 epochs (not 40)"),
    "multilabel": Figure(
        "multilabel_cpu.yaml", "test_map", ["--trainer.max_epochs=16", "--data.init_args.hflip=0"],
        data=composites,
        about="configs/multilabel_cpu.yaml on digit composites (1,000 / 200 / 400), hflip 0, 16 epochs (not 40); "
              "test macro mAP"),
}


def read_metric(work: Path, metric: str) -> float:
    """The last logged value of ``metric`` in the run's metrics.csv."""
    found = None
    for path in work.rglob("metrics.csv"):
        for row in csv.DictReader(path.open()):
            if row.get(metric):
                found = float(row[metric])
    if found is None:
        raise SystemExit(f"{work}: no {metric} in metrics.csv: did the run test its best checkpoint?")
    return found


def run_once(name: str, seed: int, work: Path, overrides: list[str]) -> float:
    """`vit fit` of one figure's recipe at one seed, in its own process under ``work``; the figure it tested."""
    figure = FIGURES[name]
    data = figure.data(work / "data") if figure.data else []
    cmd = [sys.executable, "-m", "vit", "fit", "--config", str(ROOT / "configs" / figure.config), *figure.options,
           *data, *COMMON, f"--seed_everything={seed}", *overrides]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{name} seed {seed} failed:\n{' '.join(cmd)}\n{done.stderr[-3000:]}")
    return read_metric(work, figure.metric)


def measure(names: list[str], seeds: list[int], overrides: dict[str, list[str]]) -> dict[str, list[float]]:
    """Every figure at every seed, with a progress line per run."""
    measured: dict[str, list[float]] = {}
    total, i = len(names) * len(seeds), 0
    for name in names:
        for seed in seeds:
            i += 1
            start = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix=f"figures_{name}_") as work:
                value = run_once(name, seed, Path(work), overrides.get(name, []))
            measured.setdefault(name, []).append(value)
            print(f"[{i}/{total}] {name} seed {seed}: {FIGURES[name].metric} {value:.4f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    return measured


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1; 0 for one value)."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, var**0.5


def tolerance(std: float, floor: float) -> float:
    return max(3 * std, floor)


def compare(table: dict[str, Any], measured: dict[str, list[float]]) -> list[dict[str, Any]]:
    """One row per measured figure: its mean over the seeds against the table's mean +- tolerance. A figure the table
    lacks is a failure (record it)."""
    rows = []
    for name, values in measured.items():
        value = sum(values) / len(values)
        expected = table.get("figures", {}).get(name)
        if expected is None:
            rows.append({"figure": name, "measured": value, "expected": None, "tol": None, "ok": False})
            continue
        ok = abs(value - expected["mean"]) <= expected["tol"] + 1e-9
        rows.append({"figure": name, "measured": value, "expected": expected["mean"], "tol": expected["tol"], "ok": ok})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| figure | measured | expected +- tol | ok |", "|---|---|---|---|"]
    for r in rows:
        expected = "not in the table (--record it)" if r["expected"] is None else \
            f"{r['expected']:.4f} +- {r['tol']:.4f}"
        lines.append(f"| {r['figure']} | {r['measured']:.4f} | {expected} | {'ok' if r['ok'] else 'OUT'} |")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    """The versions and CPU a figure was measured with."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        info = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        cpu = info.get("Model name", cpu).strip()
        flags = set(info.get("Flags", "").split())
    except OSError:  # no lscpu (macOS): the model from platform, no flags
        pass
    return {"python": platform.python_version(), **{p: version(p) for p in PACKAGES}, "cpu": cpu,
            "cpu_flags": [f for f in CPU_FLAGS if f in flags], "cores": os.cpu_count()}


def record(table: dict[str, Any], measured: dict[str, list[float]], seeds: list[int]) -> dict[str, Any]:
    """The table with the measured figures' mean, std and tolerance written in (others kept)."""
    figures = dict(table.get("figures", {}))
    for name, values in measured.items():
        mean, std = mean_std(values)
        figure = FIGURES[name]
        figures[name] = {"metric": figure.metric, "reduced": figure.about, "seeds": seeds,
                         "values": [round(v, 4) for v in values], "mean": round(mean, 4), "std": round(std, 4),
                         "floor": figure.floor, "tol": round(tolerance(std, figure.floor), 4),
                         "recorded": date.today().isoformat()}
    return {"tolerance": f"max(3 std, floor); floor {FLOOR} unless a figure says otherwise",
            "measured_with": environment(), "figures": dict(sorted(figures.items()))}


def parse_overrides(items: list[str]) -> dict[str, list[str]]:
    """``NAME:key=value`` -> {NAME: ["--key=value"]}."""
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, option = item.partition(":")
        if not sep or name not in FIGURES or "=" not in option:
            raise SystemExit(f"--override {item!r}: expected NAME:key=value with NAME one of {', '.join(FIGURES)}")
        out.setdefault(name, []).append("--" + option.removeprefix("--"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--only", nargs="+", choices=list(FIGURES), default=list(FIGURES))
    parser.add_argument("--record", action="store_true", help="re-measure over --seeds and write the table")
    parser.add_argument("--override", action="append", default=[], metavar="NAME:key=value",
                        help="an extra option for one figure's run, e.g. digits:model.init_args.optim.lr=0.04")
    parser.add_argument("--table", type=Path, default=TABLE)
    args = parser.parse_args(argv)
    overrides = parse_overrides(args.override)
    table = json.loads(args.table.read_text()) if args.table.is_file() else {}
    start = time.perf_counter()
    measured = measure(args.only, args.seeds, overrides)
    if args.record:
        if overrides:
            raise SystemExit("--record with --override would record a changed recipe: leave --override out")
        args.table.write_text(json.dumps(record(table, measured, args.seeds), indent=2) + "\n")
        print(f"wrote {args.table}")
    rows = compare(json.loads(args.table.read_text()) if args.table.is_file() else {}, measured)
    print(render(rows))
    print(f"{time.perf_counter() - start:.0f} s, seeds {args.seeds}")
    recorded_with, now = table.get("measured_with"), environment()
    if recorded_with and recorded_with != now:
        differ = ", ".join(f"{k} {recorded_with.get(k)} -> {now[k]}" for k in now if recorded_with.get(k) != now[k])
        print(f"note: the table was measured with another environment ({differ}); a figure out of tolerance may be it")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
