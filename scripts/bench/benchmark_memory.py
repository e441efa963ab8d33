"""Peak memory of one training step with and without gradient checkpointing, and that the step is the same.

Each arm runs in a fresh process (a process's peak RSS only grows, so arms cannot share one): it builds the
model from seed 0, records its RSS high-water mark, runs forward + cross-entropy + backward on a fixed batch,
and reports how far the high-water mark rose (the step's activations, gradients and workspace; the weights
were already there, and so was torch._dynamo, which torch.utils.checkpoint loads on its first call). The
parent compares the two arms' losses and gradients.

    python scripts/bench/benchmark_memory.py                                 # ViT-B/16, batch 16, 224x224 (~1 min)
    python scripts/bench/benchmark_memory.py --model vit_large_patch16_224 --batch_size 8
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def step(model_name: str, batch_size: int, checkpointing: bool, out: str) -> None:
    """One arm, in this process: the step's added peak RSS, its loss and its gradients, saved to ``out``."""
    # torch.utils.checkpoint imports torch._dynamo on first use: ~170 MB once per process, not the step's memory
    import torch._dynamo

    import vit

    torch.manual_seed(0)
    model = vit.create_model(model_name, num_classes=10)
    model.set_grad_checkpointing(checkpointing)
    x = torch.randn(batch_size, model.in_chans, *model.img_size)
    y = torch.randint(0, 10, (batch_size,))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    start = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    seconds = time.perf_counter() - start
    added = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    torch.save({"peak_mib": added, "seconds": seconds, "loss": loss.item(), "grads": grads}, out)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--arm", choices=["plain", "checkpointed"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.arm:  # a child process: one arm
        step(args.model, args.batch_size, args.arm == "checkpointed", args.out)
        return {}

    arms = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in ("plain", "checkpointed"):
            out = str(Path(tmp) / f"{arm}.pt")
            subprocess.run([sys.executable, __file__, "--model", args.model, "--batch_size", str(args.batch_size),
                            "--arm", arm, "--out", out], check=True)
            arms[arm] = torch.load(out)
    plain, ckpt = arms["plain"], arms["checkpointed"]
    result = {
        "model": args.model, "batch_size": args.batch_size, "threads": torch.get_num_threads(),
        "peak_mib_plain": round(plain["peak_mib"]), "peak_mib_checkpointed": round(ckpt["peak_mib"]),
        "saving": 1 - ckpt["peak_mib"] / plain["peak_mib"],
        "seconds_plain": plain["seconds"], "seconds_checkpointed": ckpt["seconds"],
        "loss_diff": abs(plain["loss"] - ckpt["loss"]),
        "max_grad_diff": (plain["grads"] - ckpt["grads"]).abs().max().item(),
    }
    print(f"{args.model}, batch {args.batch_size}, one training step on the CPU (forward + backward):")
    print(f"  peak memory added: {result['peak_mib_plain']} MiB plain, {result['peak_mib_checkpointed']} MiB with "
          f"grad checkpointing ({result['saving']:.0%} less)")
    print(f"  time: {plain['seconds']:.1f} s plain, {ckpt['seconds']:.1f} s checkpointed "
          f"({ckpt['seconds'] / plain['seconds']:.2f}x)")
    print(f"  loss diff {result['loss_diff']:.1e}, max gradient diff {result['max_grad_diff']:.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
