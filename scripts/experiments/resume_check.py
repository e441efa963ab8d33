"""Kill `vit fit` mid-epoch and resume it: does it end where the uninterrupted run ends?

The scenario of issue 25, as a user would run it: 4 classes x 120 training photos written by `vit shard`,
configs/shards_cpu.yaml as written, 3 epochs at batch 32 (15 steps an epoch), last.ckpt every 7 steps.
For each loader worker count, one uninterrupted run, and one run stopped at each kill step (in epoch 0, 1
and 2) and resumed with ``--ckpt_path last``: stopped by an exception at that step in this process (as
tests/data/test_stream.py does; a process start costs more than the run), and once, at step 21 with 2
workers, by a real SIGKILL of a `vit fit` process. Each row: the final last.ckpt's global_step, the
epochs validated (over the stopped and the resumed run's logs), and the largest weight difference from
the uninterrupted run. Then `vit validate` on the best checkpoint, against its recorded score, and a
folder DataModule (ImageFolder on the same photos) stopped in epoch 1 of 3.

The photos are crops of scikit-learn's two sample photos (china.jpg, flower.jpg), one class per half of
each photo, so no download is needed.

    python scripts/experiments/resume_check.py --out /tmp/resume_check                 # 23 fits: long on a shared CPU
    python scripts/experiments/resume_check.py --out /tmp/resume_check --workers 2 --kill_steps 21
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "shards_cpu.yaml"


def write_photos(folder: Path, per_class: int = 150, seed: int = 0) -> None:
    """folder/<class>/<i>.jpg: random crops (64 to 160 px, resized to 64) of one half of a sample photo."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    photos = load_sample_images()
    for name, photo in zip(("china", "flower"), photos.images):
        h, w, _ = photo.shape
        for half, (x0, x1) in (("left", (0, w // 2)), ("right", (w // 2, w))):
            out = folder / f"{name}_{half}"
            out.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                side = int(rng.integers(64, 161))
                x = int(rng.integers(x0, x1 - side))
                y = int(rng.integers(0, h - side))
                crop = Image.fromarray(photo[y:y + side, x:x + side]).resize((64, 64), Image.Resampling.BICUBIC)
                crop.save(out / f"{i}.jpg", quality=90)


def vit(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vit", *args], cwd=cwd, env=env, capture_output=True, text=True)


def fit_args(data: list[str], run: Path, workers: int, *extra: str) -> list[str]:
    return ["fit", "--config", str(CONFIG), *data, f"--data.init_args.num_workers={workers}",
            "--data.init_args.batch_size=32", "--trainer.max_epochs=3", "--checkpoint.every_n_train_steps=7",
            "--test_after_fit=false", "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=1",
            f"--trainer.default_root_dir={run}", f"--trainer.logger.init_args.save_dir={run}",
            f"--checkpoint.dirpath={run}/ckpt", *extra]


def validated_epochs(run: Path) -> list[int]:
    """The epoch of every validation logged under ``run``, over all its versions, in order."""
    files = sorted(run.rglob("metrics.csv"), key=lambda f: int(f.parent.name.split("_")[-1]))
    return [int(r["epoch"]) for f in files for r in csv.DictReader(f.open()) if r.get("val_loss")]


def last(run: Path) -> dict:
    return torch.load(run / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)


def max_difference(a: dict, b: dict) -> float:
    return max((a["state_dict"][k].double() - b["state_dict"][k].double()).abs().max().item() for k in a["state_dict"])


def killed_and_resumed(data: list[str], run: Path, workers: int, kill: int, env: dict[str, str] | None) -> str:
    """Stop a run at step ``kill`` (SIGKILL a `vit fit` process when ``env`` is given, else raise in this one)
    and resume it; '' when both went as expected, else what went wrong."""
    from vit.cli.main import cli

    if env is not None:
        killed = vit(fit_args(data, run, workers, "--trainer.callbacks+=tests.killer.KillAt",
                              f"--trainer.callbacks.init_args.step={kill}"), run.parent, env)
        if killed.returncode != -signal.SIGKILL:
            return f"the killed run exited {killed.returncode}: {killed.stderr[-500:]}"
        resumed = vit(fit_args(data, run, workers, "--ckpt_path=last"), run.parent, env)
        return "" if resumed.returncode == 0 else f"the resume failed: {resumed.stderr[-500:]}"
    try:
        cli(fit_args(data, run, workers, "--trainer.callbacks+=tests.killer.StopAt",
                     f"--trainer.callbacks.init_args.step={kill}"))
        return "the run was not stopped"
    except RuntimeError as e:
        if f"stopped at step {kill}" not in str(e):
            raise
    cli(fit_args(data, run, workers, "--ckpt_path=last"))
    return ""


def check_best(straight: Path, shards: list[str], workers: int, out: Path) -> None:
    """`vit validate` on the run's best checkpoint, against the score it recorded."""
    from vit.cli.main import cli

    (best,) = (straight / "ckpt").glob("best-*.ckpt")
    saved = torch.load(best, map_location="cpu", weights_only=False)
    (state,) = [v for k, v in saved["callbacks"].items() if k.startswith("BestCheckpoint")]
    checked = cli(["validate", "--config", str(CONFIG), *shards, f"--data.init_args.num_workers={workers}",
                   "--data.init_args.batch_size=32", f"--trainer.logger.init_args.save_dir={out / 'validate'}",
                   "--trainer.enable_progress_bar=false", "--ckpt_path", str(best)])
    print(f"\n{best.name}: recorded val_acc {state['best_model_score'].item():.6f}, `vit validate` "
          f"{checked.trainer.callback_metrics['val_acc'].item():.6f}\n", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a scratch folder (emptied)")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 0, 1])
    parser.add_argument("--kill_steps", type=int, nargs="+", default=[21, 10, 40], help="one in each epoch of 15")
    args = parser.parse_args()
    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's vit, and tests/killer.py
    write_photos(out / "photos")
    sharded = vit(["shard", str(out / "photos"), str(out / "shards")], out, env)
    assert sharded.returncode == 0, sharded.stderr[-2000:]
    shards = [f"--data.init_args.root={out / 'shards'}"]

    sys.path[:0] = [str(ROOT)]  # this checkout's vit, and tests/killer.py, for the runs in this process
    os.chdir(out)
    from vit.cli.main import cli

    print("| workers | run | final global_step | epochs validated | max weight difference |")
    print("| ---: | --- | ---: | --- | ---: |")
    for workers in args.workers:
        straight = out / f"w{workers}_straight"
        cli(fit_args(shards, straight, workers))
        reference = last(straight)
        print(f"| {workers} | uninterrupted | {reference['global_step']} | {validated_epochs(straight)} | - |",
              flush=True)
        if workers == args.workers[0]:
            check_best(straight, shards, workers, out)
        for kill in args.kill_steps:
            sigkill = workers == 2 and kill == 21  # the issue's own case, as it ran: a real SIGKILL
            run = out / f"w{workers}_kill{kill}"
            failed = killed_and_resumed(shards, run, workers, kill, env if sigkill else None)
            how = "SIGKILLed" if sigkill else "stopped"
            if failed:
                print(f"| {workers} | {how} at step {kill} | {failed} | | |")
                continue
            end = last(run)
            print(f"| {workers} | {how} at step {kill}, resumed | {end['global_step']} | {validated_epochs(run)} | "
                  f"{max_difference(reference, end):.3g} |", flush=True)

    # A folder DataModule, stopped in epoch 1 of 3 (at step 21) and resumed: all 3 epochs train.
    folder = ["--data=vit.data.ImageFolder", f"--data.init_args.root={out / 'photos'}"]
    run = out / "folder_kill21"
    failed = killed_and_resumed(folder, run, 2, 21, None)
    if failed:
        print(f"ImageFolder, stopped at step 21: {failed}")
    else:
        print(f"ImageFolder, stopped at step 21 and resumed: global_step {last(run)['global_step']}, "
              f"epochs validated {validated_epochs(run)}")


if __name__ == "__main__":
    main()
