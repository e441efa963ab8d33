"""One prepared run of the MAE recipes on a CUDA GPU (a few minutes on an H100/H200).

It checks and measures, in order:
  1. `configs/pretrain/mae_folder_vit_small.yaml`, `mae_folder_vit_base.yaml` and `mae_imagenet_vit_base.yaml`
     (on one GPU) as written, bf16, over a synthetic folder of JPEGs, for ``--steps`` optimiser steps: the
     images per second of the whole pipeline after the first steps, the peak GPU memory, a finite loss, the
     checkpoint and the reconstruction figure;
  2. each checkpoint into its fine-tuning recipe (configs/finetune/folder_vit_small.yaml, folder_vit_base.yaml,
     mae_imagenet_vit_base.yaml; every key checked), and a few bf16 steps of it;
  3. the MAE step against the supervised step on the GPU (scripts/bench/benchmark_mae.py), batch 16 and 256.
Everything it measures goes to --out/gpu_check_mae.json.

    python scripts/gpu/gpu_check_mae.py --out gpu_mae                         # on the GPU machine
    python scripts/gpu/gpu_check_mae.py --device cpu --quick --out /tmp/check  # a CPU smoke run of the same code
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback
from PIL import Image

from vit.cli.main import cli

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parents[1] / "configs"
PAIRS = {  # pre-training recipe -> the fine-tuning recipe that takes its encoder
    "mae_folder_vit_small": "folder_vit_small", "mae_folder_vit_base": "folder_vit_base",
    "mae_imagenet_vit_base": "mae_imagenet_vit_base",
}


class StepTimer(Callback):
    """Seconds and optimiser steps from the ``skip``-th step to the end of training."""

    def __init__(self, skip: int) -> None:
        self.skip, self.start, self.first, self.seconds, self.steps = skip, None, 0, math.nan, 0

    @staticmethod
    def _sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.start is None and trainer.global_step >= self.skip:
            self._sync()
            self.start, self.first = time.perf_counter(), trainer.global_step

    def on_train_end(self, trainer, pl_module) -> None:
        self._sync()
        if self.start is not None:
            self.seconds, self.steps = time.perf_counter() - self.start, trainer.global_step - self.first


def write_folder(root: Path, n: int, size: tuple[int, int]) -> Path:
    """``n`` smooth random JPEGs in train/ and val/ (a tenth), two class folders each: ImageNet's layout, which
    the fine-tuning recipes read with its labels and the pre-training recipes without."""
    rng = np.random.default_rng(0)
    for i in range(n):
        low = rng.random((6, 8, 3)) * 255
        image = Image.fromarray(low.astype(np.uint8)).resize(size, Image.BICUBIC)
        folder = root / ("val" if i % 10 == 0 else "train") / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{i:05d}.jpg", quality=90)
    return root


def run(argv: list[str], steps: int, skip: int, fine_tune: bool) -> dict:
    """A recipe built by `vit`'s parser and run for ``steps`` steps: throughput, memory, loss, outputs."""
    built = cli(argv, run=False)
    timer = StepTimer(skip)
    built.trainer.callbacks.append(timer)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    if fine_tune:
        built.trainer.fit(built.model, datamodule=built.datamodule)
    else:
        built.trainer.pretrain(built.model, datamodule=built.datamodule)
    trainer, data = built.trainer, built.datamodule
    batch = data.batch_size * trainer.accumulate_grad_batches
    result = {
        "steps": trainer.global_step, "global_batch": batch * trainer.world_size,
        "img_per_s": round(timer.steps * batch / timer.seconds, 1) if timer.steps else None,
        "train_loss": float(trainer.callback_metrics.get("train_loss", math.nan)),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None,
        "log_dir": trainer.log_dir,
    }
    print(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="a tiny model and few steps (a CPU smoke run)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--images", type=int, default=4096)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    quick = ["--trainer.accelerator=cpu", "--trainer.precision=32-true", "--data.init_args.img_size=32",
             "--data.init_args.batch_size=8", "--data.init_args.num_workers=0",
             "--model.init_args.model_kwargs={depth: 1, embed_dim: 32, num_heads: 2}"] if args.quick else []
    steps, skip = (4, 1) if args.quick else (args.steps, 10)
    folder = write_folder(out / "data", 64 if args.quick else args.images, (64, 48) if args.quick else (400, 300))
    common = ["--trainer.devices=1", "--trainer.strategy=auto", "--trainer.enable_progress_bar=false",
              "--trainer.num_sanity_val_steps=0", f"--trainer.max_steps={steps}", "--trainer.max_epochs=1000",
              f"--trainer.default_root_dir={out}", f"--trainer.logger.init_args.save_dir={out}/logs", *quick]
    results: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    for recipe, fine_tuning in PAIRS.items():
        ckpt_dir = out / recipe
        start = time.perf_counter()
        pretrained = run(["--config", str(CONFIGS / "pretrain" / f"{recipe}.yaml"), f"--data.init_args.root={folder}",
                          f"--checkpoint.dirpath={ckpt_dir}", "--trainer.limit_val_batches=2",
                          "--trainer.check_val_every_n_epoch=1", *common,
                          *(["--model.init_args.decoder_dim=32", "--model.init_args.decoder_depth=1",
                             "--model.init_args.decoder_heads=2"] if args.quick else [])], steps, skip, False)
        last = ckpt_dir / "last.ckpt"
        figures = sorted(Path(pretrained["log_dir"]).glob("reconstructions/*.png"))
        pretrained |= {"checkpoint": last.is_file(), "figure": figures[-1].name if figures else None,
                       "seconds": round(time.perf_counter() - start, 1)}
        tuned = run(["--config", str(CONFIGS / "finetune" / f"{fine_tuning}.yaml"), f"--data.init_args.root={folder}",
                     f"--model.init_args.pretrained={last}", f"--checkpoint.dirpath={out}/{fine_tuning}_ft",
                     "--trainer.limit_val_batches=2", "--test_after_fit=false", *common], min(steps, 20), 2, True)
        results[recipe] = {"pretrain": pretrained, "fine_tune": tuned}
        (out / "gpu_check_mae.json").write_text(json.dumps(results, indent=2))
    spec = importlib.util.spec_from_file_location("benchmark_mae", HERE.parent / "bench" / "benchmark_mae.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    model = "vit_tiny_patch16_224" if args.quick else "vit_base_patch16_224"
    dtype = "fp32" if args.quick else "bf16"
    for batch in (16, 256) if not args.quick else (2,):
        results[f"step_ratio_batch{batch}_{dtype}"] = benchmark.main(
            ["--model", model, "--batch", str(batch), "--device", args.device, "--dtype", dtype, "--steps", "5"])
    (out / "gpu_check_mae.json").write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
