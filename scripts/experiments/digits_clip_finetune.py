"""Why the fine-tune from the zero-shot head lost accuracy on the digits CLIP (0.915 -> 0.852, docs/zeroshot.md;
issue 63): arms side by side on the same trained CLIPs, each one or two changes to the old fine-tune of
digits_clip.py (the random affine the contrastive training lacked, the lr, the warm-up, the epochs, the label
smoothing, the head's scale), 3 seeds. Each arm is digits_clip.py's `fine_tune` with that script's flags; it
reports the test top-1 at the start (epoch 0, the zero-shot head) and at the end, and what the recipe keeps
(`keep_better`: the fine-tuned end only when it beats the start on validation).

    python scripts/experiments/digits_clip.py --seeds 0 1 2 --ft_epochs 0   # the CLIPs, once: runs/digits_clip/seed*/
    python scripts/experiments/digits_clip_finetune.py --seeds 0 1 2       # every arm on them; the table at the end

Only runs/digits_clip/seed*/clip.ckpt is read (digits_clip.py's --out). About 6-8 s a 10-epoch fine-tune with one
torch thread on the shared 2-core machine; the whole table about 6 minutes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from digits_clip import fine_tune, keep_better, parse

# Each arm: digits_clip.py's flags, after OLD_TEN (the old fine-tune's 10 epochs without warm-up; argparse takes
# the last). The old recipe also had the affine on (--ft_affine); the new one is the last arm (the script's defaults).
OLD_TEN = ["--ft_epochs", "10", "--ft_warmup", "0"]
ARMS = {
    "old recipe (affine, lr 5e-4, smoothing 0.1, 10 epochs)": ["--ft_affine"],
    "lr 1e-4": ["--ft_affine", "--ft_lr", "1e-4"],
    "lr 2e-5": ["--ft_affine", "--ft_lr", "2e-5"],
    "no label smoothing": ["--ft_affine", "--ft_smoothing", "0"],
    "head x 4": ["--ft_affine", "--ft_head_scale", "4"],
    "head / 4": ["--ft_affine", "--ft_head_scale", "0.25"],
    "no affine": [],
    "no affine, no smoothing": ["--ft_smoothing", "0"],
    "no affine, lr 1e-4": ["--ft_lr", "1e-4"],
    "no affine, warm-up 1": ["--ft_warmup", "1"],
    "no affine, 20 epochs": ["--ft_epochs", "20"],
    "no affine, lr 1e-4, 20 epochs": ["--ft_lr", "1e-4", "--ft_epochs", "20"],
    "no affine, warm-up 1, 20 epochs (the new recipe)": ["--ft_warmup", "1", "--ft_epochs", "20"],
}


def mean_sd(values: Sequence[float]) -> str:
    """Mean and sample sd, and the values: "0.852 ± 0.052 (0.900, 0.861, 0.797)"."""
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)) ** 0.5
    return f"{mean:.3f} ± {sd:.3f} ({', '.join(f'{v:.3f}' for v in values)})"


def main(argv: Sequence[str] | None = None) -> dict[str, list[dict]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--clips", default="runs/digits_clip", help="digits_clip.py's --out (seed*/clip.ckpt)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the shared 2-core machine
    results: dict[str, list[dict]] = {}
    for name in args.arms:
        for seed in args.seeds:
            start = time.perf_counter()
            clip = Path(args.clips) / f"seed{seed}" / "clip.ckpt"
            curves, _ = fine_tune(seed, clip, "zeroshot", parse(OLD_TEN + ARMS[name]))
            run = {"arm": name, "seed": seed, "val": curves.val, "test": curves.test, "start": curves.test[0],
                   "end": curves.test[-1], "kept": curves.test[keep_better(curves.val)],
                   "seconds": round(time.perf_counter() - start, 1)}
            print(json.dumps(run), flush=True)
            results.setdefault(name, []).append(run)
    print("| arm (digits_clip.py flags after OLD_TEN) | start (zero-shot head) | end of the fine-tune | "
          "kept by validation |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        cells = " | ".join(mean_sd([r[k] for r in runs]) for k in ("start", "end", "kept"))
        print(f"| {name} (`{' '.join(ARMS[name]) or '-'}`) | {cells} |")
    return results


if __name__ == "__main__":
    main()
