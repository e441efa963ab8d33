"""One prepared run of the GPU path, for a machine with a CUDA GPU (sized for a few minutes on an H100/H200).

It checks and measures, in order:
  1. the attention kernel on the GPU in bf16: the flash SDPA backend accepts our tensors, and the fast
     path agrees with the explicit path that returns the weights;
  2. throughput of our ViT against timm's (scripts/bench/benchmark.py), eager fp32 and bf16, then bf16 with
     torch.compile on both;
  3. a Lightning fit of the digits classifier with precision bf16-mixed under the DDP strategy;
  4. a short FSDP fit of ViT-B/16 on synthetic images as configs/finetune/mae_imagenet_vit_large_fsdp.yaml
     shards it (each EncoderBlock a unit, activation-checkpointed, bf16-mixed, sharded checkpoint), then the
     sharded checkpoint consolidated by `vit export --format ckpt` in a fresh process and compared with the
     trained weights. (On a CPU, Lightning refuses FSDP: the smoke run takes DDP there.)
Everything it measures goes to --out/gpu_check.json (and the benchmark JSONs beside it).

    python scripts/gpu/gpu_check.py --out gpu_check                        # on the GPU machine
    python scripts/gpu/gpu_check.py --device cpu --quick --out /tmp/check  # a CPU smoke run of the same code
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from vit.nn.attention import MultiHeadAttention

HERE = Path(__file__).resolve().parent


def load_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark", HERE.parent / "bench" / "benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sdpa_kernels(fn) -> list[str]:
    """The aten scaled-dot-product kernels that `fn()` ran, as the profiler saw them (the backend torch chose)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        fn()
    return sorted({e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")})


def check_attention(device: str) -> dict:
    """Which SDPA backend our attention gets by default, and its agreement with the explicit path."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    attn = MultiHeadAttention(768, 12).to(device, dtype).eval()
    x = torch.randn(8, 197, 768, device=device, dtype=dtype)
    with torch.no_grad():
        chosen = sdpa_kernels(lambda: attn(x))  # no backend forced: what users get
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # raises if flash cannot take these inputs
            fast = attn(x)
            causal = attn(x, is_causal=True)
        explicit, _ = attn(x, return_attention=True)
        explicit_causal, _ = attn(x, is_causal=True, return_attention=True)
    return {
        "sdpa_kernels": chosen,
        "flash_selected": any("flash" in name for name in chosen),
        "dtype": str(dtype),
        "max_abs_diff_fast_vs_explicit": (fast - explicit).abs().max().item(),
        "max_abs_diff_causal": (causal - explicit_causal).abs().max().item(),
    }


def lightning_fit(device: str, quick: bool, out: Path) -> dict:
    """Digits classifier through Lightning: bf16-mixed precision, DDP strategy, one device."""
    from lightning.pytorch import Trainer, seed_everything

    from vit.data.digits import Digits
    from vit.tasks.classify import ImageClassifier
    from vit.tasks.optim import Optimization

    seed_everything(0)
    gpu = device.startswith("cuda")
    data = Digits(img_size=16, batch_size=64, num_workers=2)
    model = ImageClassifier(
        model="vit_digits_patch4_16", num_classes=data.num_classes, class_names=data.class_names,
        mean=data.mean, std=data.std, optim=Optimization(lr=4e-3, warmup_epochs=1, ema_decay=0.995),
    )
    epochs = 1 if quick else 30
    trainer = Trainer(
        accelerator="gpu" if gpu else "cpu", devices=1, strategy="ddp", precision="bf16-mixed",
        max_epochs=epochs, default_root_dir=str(out / "lightning"), enable_progress_bar=False,
        logger=False, enable_checkpointing=False,
        limit_train_batches=4 if quick else None,  # bf16 without native CPU support: 0.6 s a step on 2 cores
    )
    start = time.perf_counter()
    trainer.fit(model, datamodule=data)
    seconds = time.perf_counter() - start
    result = trainer.test(model, datamodule=data, verbose=False)[0]
    trainer.save_checkpoint(out / "digits.ckpt")  # so the test accuracy can be recomputed independently
    images = min(len(data.train_set), trainer.num_training_batches * data.batch_size)
    return {
        "epochs": epochs,
        "fit_seconds": seconds,
        "train_images_per_s": epochs * images / seconds,
        "test_acc": result["test_acc"],
    }


def fsdp_fit(device: str, quick: bool, out: Path) -> dict:
    """A few FSDP training steps of ViT-B/16 (ViT-tiny in --quick) on synthetic images, then the consolidation."""
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.utils.data import DataLoader, TensorDataset

    from vit.checkpoints.io import read_checkpoint
    from vit.nn.blocks import EncoderBlock
    from vit.nn.roles import wrapped_name as original_name
    from vit.tasks.classify import ImageClassifier
    from vit.tasks.optim import Optimization

    seed_everything(0)
    gpu = device.startswith("cuda")
    name, size, batch, steps = ("vit_tiny_patch16_224", 32, 8, 4) if quick else ("vit_base_patch16_224", 224, 64, 40)
    labels = torch.randint(0, 10, (batch * 8,))
    images = torch.randn(len(labels), 3, size, size) + labels.view(-1, 1, 1, 1) * 0.1  # learnable: a class offset
    loader = DataLoader(TensorDataset(images, labels), batch_size=batch, shuffle=True, drop_last=True)
    task = ImageClassifier(model=name, num_classes=10, img_size=size,
                           optim=Optimization(lr=1e-4, layer_decay=0.75, warmup_steps=2))
    strategy = FSDPStrategy(auto_wrap_policy={EncoderBlock}, activation_checkpointing_policy={EncoderBlock},
                            state_dict_type="sharded") if gpu else "ddp"
    trainer = Trainer(
        accelerator="gpu" if gpu else "cpu", devices=1, strategy=strategy, precision="bf16-mixed", max_steps=steps,
        default_root_dir=str(out / "fsdp"), enable_progress_bar=False, logger=False, enable_checkpointing=False,
        enable_model_summary=False,
    )
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    trainer.fit(task, train_dataloaders=loader)
    seconds = time.perf_counter() - start
    saved = out / "fsdp.ckpt"  # a folder of shards under FSDP
    trainer.save_checkpoint(saved)
    trained = {original_name(k): v.detach().float().cpu() for k, v in task.model.named_parameters()}
    # Consolidate as a user would: another process, no GPU or process group (`vit export` imports no Lightning).
    done = subprocess.run([sys.executable, "-m", "vit", "export", "--ckpt", str(saved), "--format", "ckpt",
                           "--out", str(out / "fsdp_export")], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"vit export --format ckpt failed: {done.stderr[-1500:]}")
    consolidated = read_checkpoint(out / "fsdp_export" / "model.ckpt")["state_dict"]
    diff = max((consolidated[f"model.{k}"].float() - v).abs().max().item() for k, v in trained.items())
    groups = trainer.optimizers[0].param_groups
    return {
        "model": name, "strategy": type(trainer.strategy).__name__, "precision": "bf16-mixed", "steps": steps,
        "batch_size": batch, "images_per_s": steps * batch / seconds, "fit_seconds": seconds,
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if gpu else None,
        "sharded_checkpoint": saved.is_dir(), "checkpoint_files": sorted(p.name for p in saved.iterdir())
        if saved.is_dir() else [saved.name],
        "consolidated_max_abs_diff": diff, "param_groups": len(groups),
        "decayed_groups": sum(g["weight_decay"] > 0 for g in groups),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--batch_size", "--batch-size", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of every step")
    parser.add_argument("--out", default="gpu_check")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"torch": torch.__version__, "device": args.device}
    if args.device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name(args.device)
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 rows use TF32 tensor cores, as users would
        torch.backends.cudnn.allow_tf32 = True

    report["attention"] = check_attention(args.device)
    print("attention:", report["attention"], flush=True)

    benchmark = load_benchmark()
    model, batch = ("vit_digits_patch4_16", 8) if args.quick else (args.model, args.batch_size)
    runs = ["--runs", "1", "--iters", "1", "--warmup", "0"] if args.quick else ["--runs", "5", "--iters", "5"]
    common = ["--model", model, "--batch_size", str(batch), "--device", args.device, *runs]
    report["eager"] = benchmark.main([*common, "--json", str(out / "bench_eager.json")])
    if not args.quick:
        report["compiled"] = benchmark.main(
            [*common, "--precision", "bf16", "--compile", "--json", str(out / "bench_compile.json")]
        )

    report["lightning"] = lightning_fit(args.device, args.quick, out)
    print("lightning:", report["lightning"], flush=True)
    try:  # last, and caught: the measurements above are written whatever happens here
        report["fsdp"] = fsdp_fit(args.device, args.quick, out)
    except Exception as e:
        traceback.print_exc()
        report["fsdp"] = {"error": f"{type(e).__name__}: {e}"}
    print("fsdp:", report["fsdp"], flush=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out / 'gpu_check.json'}")
    return report


if __name__ == "__main__":
    main()
