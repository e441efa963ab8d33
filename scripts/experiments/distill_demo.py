"""Big to small: distil a trained ViT into one at least 4x cheaper, on a real folder that ships offline.

    python scripts/experiments/small_folders.py ~/small --only mnist5k
    python scripts/experiments/distill_demo.py ~/small/mnist5k --seeds 3 --recipe_args "--data.init_args.hflip 0"

The deployment case of distillation: a user has a good model and wants a much cheaper one that keeps most of
its accuracy. Three arms, each a `vit fit` process as a user runs it:

    teacher    configs/scratch_small.yaml as written (ViT dim 96, depth 4, 4 heads, 32 px in 8x8 patches)
    student    the same recipe with the student's ViT (dim 48, depth 3, 2 heads: FLOPs counted below), no teacher
    distilled  configs/distill_small.yaml as written (soft distillation, 70 epochs) with the same student ViT,
               taught by the teacher's best checkpoint of the same seed (--model.init_args.teacher best
               --model.init_args.teacher_dir ...)

Then, in this process and side by side: FLOPs per image (torch's FlopCounterMode on one forward) and CPU img/s of
each checkpoint at batch 1 and batch 32 (``--threads`` threads, interleaved rounds, the median). Test top-1 is
each run's own "test accuracy" line; the table gives the mean over seeds, the spread and the mean wall time.
The runs are kept in ``--work`` (runs.json): run again with the same ``--work`` and only what is missing is
trained, so the timing can be redone alone on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from parity import run_vit_fit, summarize  # the parity table's own (a sibling: its folder is on sys.path)

ROOT = Path(__file__).resolve().parents[2]

STUDENT = "{embed_dim: 48, depth: 3, num_heads: 2, drop_path_rate: 0.1, global_pool: %s}"
ARMS = ("teacher", "student", "distilled")


def arm_args(arm: str, folder: Path, seed: int, work: Path, epochs: int | None, threads: int, workers: int,
             recipe_args: list[str]) -> list[str]:
    """The `vit fit` flags of one arm and seed (the teacher of the same seed lies in work/teacher_<seed>)."""
    config = ROOT / "configs" / ("distill_small.yaml" if arm == "distilled" else "scratch_small.yaml")
    args = ["--config", str(config), "--data.init_args.root", str(folder), "--seed_everything", str(seed),
            "--trainer.enable_progress_bar", "false", "--num_threads", str(threads),
            "--data.init_args.num_workers", str(workers), *recipe_args]
    if epochs is not None:
        args += ["--trainer.max_epochs", str(epochs)]
    if arm == "student":
        args += ["--model.init_args.model_kwargs", STUDENT % "avg"]  # the recipe's pooling
    if arm == "distilled":  # DeiT's heads read the cls and dist tokens
        teacher_dir = work / f"teacher_{seed}" / "logs" / "scratch_small" / "checkpoints"  # the recipe's dirpath
        args += ["--model.init_args.model_kwargs", STUDENT % "token", "--model.init_args.teacher", "best",
                 "--model.init_args.teacher_dir", str(teacher_dir)]
    return args


def flops_per_image(model: Any, shape: tuple[int, ...]) -> int:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    # The math backend spells attention out in bmm's, which the counter sees (torch 2.14 counts no CPU fused kernel).
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, *shape))
    return int(counter.get_total_flops())


def speeds(checkpoints: dict[str, Path], threads: int, rounds: int = 5) -> dict[str, dict[str, float]]:
    """FLOPs and img/s at batch 1 and 32 of each checkpoint, timed in interleaved rounds (median)."""
    import torch

    from vit.deploy import load_classifier

    torch.set_num_threads(threads)
    models = {arm: load_classifier(path) for arm, path in checkpoints.items()}
    shapes = {arm: (m.in_chans, *m.img_size) for arm, m in models.items()}
    results = {arm: {"gflops": flops_per_image(m.model, shapes[arm]) / 1e9} for arm, m in models.items()}
    timings: dict[tuple[str, int], list[float]] = {}
    with torch.inference_mode():
        for _ in range(rounds):
            for arm, classifier in models.items():
                for batch in (1, 32):
                    x = torch.randn(batch, *shapes[arm])
                    classifier.model(x)  # warm
                    repeats = 200 if batch == 1 else 20
                    start = time.perf_counter()
                    for _ in range(repeats):
                        classifier.model(x)
                    timings.setdefault((arm, batch), []).append(batch * repeats / (time.perf_counter() - start))
    for (arm, batch), values in timings.items():
        results[arm][f"img_s_b{batch}"] = statistics.median(values)
    return results


def table(runs: dict[str, list[dict[str, Any]]], speed: dict[str, dict[str, float]]) -> str:
    lines = ["| model | test top-1, mean (spread) | seeds | GFLOPs an image | img/s, batch 1 | img/s, batch 32 | "
             "wall time a run |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    names = {"teacher": "teacher: scratch_small (dim 96, depth 4)", "student": "student alone (dim 48, depth 3)",
             "distilled": "student distilled from the teacher (distill_small)"}
    for arm, results in runs.items():
        acc, s = summarize(results), speed[arm]
        lines.append(f"| {names[arm]} | {acc['mean']:.3f} ({acc['spread']:.3f}) | {len(results)} | "
                     f"{s['gflops']:.4f} | {s['img_s_b1']:.0f} | {s['img_s_b32']:.0f} | {acc['seconds']:.0f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("folder", type=Path, help="a split folder (train/ val/ test/), e.g. from small_folders.py")
    parser.add_argument("--work", type=Path, default=Path("distill_demo"), help="runs and checkpoints go here")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 for every arm")
    parser.add_argument("--epochs", type=int, default=None, help="fewer epochs than the recipes' (a quick run)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads, in training and timing")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of every run")
    parser.add_argument("--recipe_args", default="", help="more `vit fit` flags for every arm, e.g. "
                        "\"--data.init_args.hflip 0\" for digits")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if not all((args.folder / s).is_dir() for s in ("train", "val", "test")):
        raise SystemExit(f"{args.folder} needs train/ val/ test/ folders: build one with "
                         "scripts/experiments/small_folders.py")
    import shlex

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    saved = work / "runs.json"
    done: dict[str, dict[str, Any]] = json.loads(saved.read_text()) if saved.is_file() else {}
    for seed in range(args.seeds):
        for arm in ARMS:  # the teacher first: the distilled student of the same seed reads its best checkpoint
            key = f"{arm}_{seed}"
            if key in done:
                continue
            (work / key).mkdir(exist_ok=True)
            start = time.perf_counter()
            result = run_vit_fit(arm_args(arm, args.folder.resolve(), seed, work, args.epochs, args.threads,
                                          args.workers, shlex.split(args.recipe_args)), work / key)
            done[key] = {**result, "seconds": time.perf_counter() - start}
            saved.write_text(json.dumps(done, indent=1))
            print(f"{arm} seed {seed}: test top-1 {result['acc']:.4f} in {done[key]['seconds']:.0f} s", flush=True)
    runs = {arm: [done[f"{arm}_{seed}"] for seed in range(args.seeds)] for arm in ARMS}
    checkpoints = {arm: sorted((work / f"{arm}_0").rglob("best-*.ckpt"), key=lambda p: p.stat().st_mtime)[-1]
                   for arm in ARMS}
    speed = speeds(checkpoints, args.threads)
    ratio = speed["teacher"]["gflops"] / speed["student"]["gflops"]
    print(table(runs, speed))
    print(f"the student costs {ratio:.1f}x fewer FLOPs than the teacher; timed with {args.threads} threads "
          f"on seed 0's checkpoints")
    results = {"runs": runs, "speed": speed, "flops_ratio": ratio}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return results


if __name__ == "__main__":
    main()
