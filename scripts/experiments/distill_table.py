"""Distillation on small folders: scratch_small against a convnet teacher and its distilled students, over seeds.

    python scripts/experiments/small_folders.py ~/small
    python scripts/experiments/distill_table.py ~/small/digits ~/small/mnist5k --recipe_args "--data.init_args.hflip 0"
    python scripts/experiments/distill_table.py ~/small/tiles --json distill_tiles.json

Per folder and seed, each a `vit fit` in its own process (imports included in its wall time), as a user runs them:

    scratch   configs/scratch_small.yaml
    teacher   configs/teacher_small.yaml
    hard      configs/distill_small.yaml with DeiT's hard distillation (alpha 0.5), taught by that seed's teacher
              (its best checkpoint)
    soft      configs/distill_small.yaml as written (soft, alpha 0.9, tau 4), taught by the same teacher
    alone     the student's architecture and schedule without a teacher (--model.class_path vit.tasks.ImageClassifier:
              the plain classifier, which drops the distillation options): what distillation itself adds, apart
              from the student's longer schedule and token heads

``--recipe_args`` go to every arm (the knobs the recipes document, e.g. no flips for digits); ``--teacher_args`` to
the teacher alone and ``--student_args`` to the three students (the variants docs/small-folders.md measured). The
table gives test top-1, mean of the seeds (spread in brackets) and mean wall time per run, and the teacher + recipe
(soft) student's wall time as a multiple of scratch_small's. Compare means over 3+ seeds: seed-to-seed spread is
several points here.
"""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parity import run_vit_fit, summarize  # the sibling script's runner (its folder is on sys.path when run)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"scratch": "scratch_small", "teacher": "teacher_small", "hard": "distill_small", "soft": "distill_small",
           "alone": "distill_small"}
ARMS = tuple(CONFIGS)
ARM_ARGS = {"hard": ("--model.init_args.distill_alpha", "0.5")}  # DeiT's hard distillation; soft: the recipe's own


def run_seed(folder: Path, seed: int, arms: Sequence[str], common: list[str],
             extra: dict[str, list[str]] | None = None) -> dict[str, dict[str, Any]]:
    """Every arm on one seed, each in a folder of its own; the students read the teacher's folder. ``extra``: more
    flags for an arm, after its own (the last of a repeated flag wins)."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="distill-") as tmp:
        teacher_dir = Path(tmp) / "teacher" / "logs" / "teacher_small" / "checkpoints"
        for arm in arms:
            work = Path(tmp) / arm
            work.mkdir()
            args = ["--config", str(ROOT / "configs" / f"{CONFIGS[arm]}.yaml"), "--seed_everything", str(seed), *common]
            if arm in ("hard", "soft"):
                args += ["--model.init_args.teacher", "best", "--model.init_args.teacher_dir", str(teacher_dir),
                         "--model.init_args.distillation", arm, *ARM_ARGS.get(arm, ())]
            args += (extra or {}).get(arm, [])
            if arm == "alone":  # last: the plain classifier drops every distillation option given before
                args += ["--model.class_path", "vit.tasks.ImageClassifier"]
            start = time.perf_counter()
            results[arm] = {**run_vit_fit(args, work), "seconds": time.perf_counter() - start}
            print(f"{folder.name} {arm} seed {seed}: {results[arm]['acc']:.4f} in {results[arm]['seconds']:.0f} s",
                  flush=True)
    return results


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Markdown: a row per folder, a column per arm (mean (spread), wall s), and the wall-time multiple."""
    lines = ["| folder | " + " | ".join(ARMS) + " | teacher + soft, x scratch's time |",
             "| --- |" + " ---: |" * (len(ARMS) + 1)]
    for folder, arms in results.items():
        cells = [f"{s['mean']:.3f} ({100 * s['spread']:.1f}), {s['seconds']:.0f} s" if (s := arms.get(arm)) else ""
                 for arm in ARMS]
        ratio = ""
        if all(a in arms for a in ("scratch", "teacher", "soft")):  # soft: the recipe as written
            ratio = f"{(arms['teacher']['seconds'] + arms['soft']['seconds']) / arms['scratch']['seconds']:.2f}"
        lines.append(f"| {folder} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("folders", nargs="+", type=Path, help="split folders (train/ val/ test/)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    parser.add_argument("--first_seed", type=int, default=0, help="start the seeds here (to extend a table)")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS),
                        help="the students need the teacher arm in the same run")
    parser.add_argument("--epochs", type=int, help="every arm's epochs (default: the recipes', 40)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of every arm")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads of every arm")
    parser.add_argument("--recipe_args", default="", help="more `vit fit` flags for every arm, e.g. "
                        "\"--data.init_args.hflip 0\" for digits")
    parser.add_argument("--teacher_args", default="", help="more `vit fit` flags for the teacher arm only, e.g. "
                        "\"--model.init_args.head.init_args.label_smoothing 0\"")
    parser.add_argument("--student_args", default="", help="more `vit fit` flags for the hard, soft and alone arms, "
                        "e.g. \"--model.init_args.teacher last\" (the teacher's last checkpoint, not its best)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if {"hard", "soft"} & set(args.arms) and "teacher" not in args.arms:
        parser.error("the hard and soft students learn from this run's teacher: add the teacher arm")
    extra = {"teacher": shlex.split(args.teacher_args),
             **{arm: shlex.split(args.student_args) for arm in ("hard", "soft", "alone")}}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for folder in args.folders:
        missing = [s for s in ("train", "val", "test") if not (folder / s).is_dir()]
        if missing:
            raise SystemExit(f"{folder} lacks {', '.join(missing)}/: build folders with "
                             "scripts/experiments/small_folders.py")
        common = ["--data.init_args.root", str(folder.resolve()), "--trainer.enable_progress_bar", "false",
                  "--data.init_args.num_workers", str(args.workers), "--num_threads", str(args.threads),
                  *(["--trainer.max_epochs", str(args.epochs)] if args.epochs else []), *shlex.split(args.recipe_args)]
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in args.arms}
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for arm, result in run_seed(folder, seed, args.arms, common, extra).items():
                runs[arm].append({**result, "seed": seed})
        results[folder.name] = {arm: {**summarize(r), "runs": r} for arm, r in runs.items()}
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
