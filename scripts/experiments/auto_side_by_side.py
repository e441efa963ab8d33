"""`--backend auto` against every fixed backend it chooses among, side by side in one process: what `vit predict`
and `vit serve` get from `load_classifier(ckpt, backend="auto")` (its choice measured afresh, no cache) against
`load_classifier(ckpt, backend=NAME)` for each candidate, at batch 1 and 8 (docs/speed.md, "`--backend auto`").

    flock /tmp/vit-heavy.lock python scripts/experiments/auto_side_by_side.py --ckpt CKPT [--ckpt CKPT2] [--rounds 15]

Timing: ``--rounds`` rounds; in each, every model in turn (the order reversed every other round) runs batches of
seeded noise images for at least ``--seconds``. Printed per batch size: each model's median img/s, and auto's
ratio to each fixed backend, the median of the per-round ratios (a busy machine slows a round's models alike).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from vit.deploy import load_classifier
from vit.deploy.backends import auto_candidates


def img_s(model, batch: torch.Tensor, seconds: float) -> float:
    count, start = 0, time.perf_counter()
    with torch.inference_mode():
        while True:
            model(batch)
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return count * len(batch) / elapsed


def side_by_side(ckpt: Path, batch_size: int, rounds: int, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:  # a copy: no cached choice from an earlier run
        copy = Path(tmp, ckpt.name)
        shutil.copy(ckpt, copy)
        auto = load_classifier(copy, backend="auto", batch_size=batch_size)
        models = {"auto": auto} | {name: load_classifier(copy, backend=name) for name in auto_candidates(copy)}
    batch = torch.randn(batch_size, auto.in_chans, *auto.img_size, generator=torch.Generator().manual_seed(0))
    speed: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():
        img_s(model, batch, 0.2)  # warm-up
    for r in range(rounds):
        for name in list(models) if r % 2 == 0 else list(models)[::-1]:
            speed[name].append(img_s(models[name], batch, seconds))
    chosen = auto.auto["backend"]
    best = max((n for n in models if n != "auto"), key=lambda n: statistics.median(speed[n]))
    print(f"\n{ckpt.name}, batch {batch_size}: auto chose {chosen}; the fastest fixed backend here: {best}")
    print("| backend | img/s (median) | auto / it (median of the rounds' ratios) |\n| --- | ---: | ---: |")
    for name, ips in speed.items():
        ratio = statistics.median(a / i for a, i in zip(speed["auto"], ips))
        print(f"| {name}{' (chosen)' if name == chosen else ''} | {statistics.median(ips):.1f} | {ratio:.3f} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", action="append", required=True)
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    for ckpt in args.ckpt:
        for b in args.batch_sizes:
            side_by_side(Path(ckpt), b, args.rounds, args.seconds)


if __name__ == "__main__":
    main()
