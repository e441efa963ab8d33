"""What LoRA and DoRA save in a training step on the CPU: peak memory, optimiser state, checkpoint size and step time,
full fine-tuning against LoRA r=8 on q and v against DoRA, and ours against HF PEFT at the same rank and targets.

Memory: each arm runs in a fresh process (a process's peak RSS only grows, so arms cannot share one), the way
`benchmark_memory.py` and the `Q-grad-checkpointing` check measure it: build the model from seed 0, record the RSS
high-water mark, run one training step (forward, cross-entropy, backward and the AdamW step, which allocates the
optimiser's state), and report how far the mark rose. The weights were there before; gradients, activations and
the optimiser state are the step's. The same process counts the optimiser-state bytes and the size of the
checkpoint that arm needs (the trainable tensors and their optimiser state; the frozen backbone comes from the
base weights, as LoRA checkpoints do).

Time: every arm's model lives in one process, and their steps alternate (arm after arm, repeat after repeat), so a
busy machine slows them alike; the figure is each arm's median step.

The PEFT arms are timm's same-size ViT with `peft.get_peft_model(LoraConfig(target_modules=["qkv"]))`: PEFT adapts
whole modules, so its nearest to our q,v slices is LoRA on the whole fused qkv, and we time ours on qkv too.

    python scripts/bench/lora_memory_speed.py                     # ViT-B/16, batch 16, 224x224 (a few minutes)
    python scripts/bench/lora_memory_speed.py --model vit_tiny_patch16_224 --batch_size 2 --repeats 1
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

NUM_CLASSES = 10
BIG = ("vit_base_patch16_224", "vit_large_patch14_dinov2", "vit_giant_patch14_dinov2", "vit_7b_patch16_dinov3")
# arm: (which model, adapter options); "ours" is vit's ViT with vit.nn.lora, "peft" timm's ViT with HF peft
ARMS = {
    "full": ("ours", None),
    "lora_qv": ("ours", dict(targets=("q", "v"))),
    "dora_qv": ("ours", dict(targets=("q", "v"), dora=True)),
    "lora_qkv": ("ours", dict(targets=("qkv",))),
    "peft_lora_qkv": ("peft", dict(use_dora=False)),
    "dora_qkv": ("ours", dict(targets=("qkv",), dora=True)),
    "peft_dora_qkv": ("peft", dict(use_dora=True)),
}


def build(arm: str, model_name: str, rank: int, **overrides) -> tuple[nn.Module, list[nn.Parameter]]:
    """The arm's model (seed 0; ``overrides`` of the named config, e.g. depth, for a test) in training mode, and
    the parameters that train: all of them (full), or the adapters and the head."""
    torch.manual_seed(0)
    kind, options = ARMS[arm]
    if kind == "peft":
        import peft
        import timm

        model = timm.create_model(model_name, num_classes=NUM_CLASSES, **overrides)
        config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["qkv"], modules_to_save=["head"],
                                 **options)
        model = peft.get_peft_model(model, config)
    else:
        import vit

        model = vit.create_model(model_name, num_classes=NUM_CLASSES, **overrides)
        if options is not None:
            from vit.nn.lora import LoraConfig, add_adapters

            base = {id(p) for p in model.parameters()}
            add_adapters(model, LoraConfig(rank=rank, alpha=2 * rank, **options))
            head = {id(p) for p in model.get_classifier().parameters()}
            for p in model.parameters():  # the adapters (new parameters) and the head train; the rest is frozen
                p.requires_grad_(id(p) not in base or id(p) in head)
    return model.train(), [p for p in model.parameters() if p.requires_grad]


def batch(model_name: str, batch_size: int, **overrides) -> tuple[torch.Tensor, torch.Tensor]:
    import vit

    size = vit.create_model(model_name, **{**overrides, "depth": 1}).img_size  # the input size, cheaply
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch_size, 3, *size, generator=g), torch.randint(0, NUM_CLASSES, (batch_size,), generator=g)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def checkpoint_bytes(model: nn.Module, optimizer: torch.optim.Optimizer, full: bool) -> tuple[int, int]:
    """Bytes of the arm's checkpoint as torch.save writes it: the weights it must hold (all of them for full
    fine-tuning; the trainable ones otherwise), alone and with their optimiser state."""
    weights = {n: p.detach() for n, p in model.named_parameters() if full or p.requires_grad}
    sizes = []
    for payload in (weights, {"weights": weights, "optimizer": optimizer.state_dict()}):
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        sizes.append(buffer.tell())
    return sizes[0], sizes[1]


def measure_memory(arm: str, model_name: str, batch_size: int, rank: int, **overrides) -> dict:
    """One arm, in this (fresh) process: the step's added peak RSS and what its training state weighs."""
    x, y = batch(model_name, batch_size, **overrides)
    model, trainable = build(arm, model_name, rank, **overrides)
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    train_step(model, optimizer, x, y)
    added = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    state = tensor_bytes(t for s in optimizer.state.values() for t in s.values())
    weights, with_state = checkpoint_bytes(model, optimizer, full=arm == "full")
    return {"peak_mib": added, "trainable": sum(p.numel() for p in trainable),
            "params": sum(p.numel() for p in model.parameters()), "optimizer_bytes": state,
            "checkpoint_weights_bytes": weights, "checkpoint_bytes": with_state}


def measure_time(arms: list[str], model_name: str, batch_size: int, rank: int, repeats: int,
                 **overrides) -> dict[str, float]:
    """Median seconds of a training step for each arm, all in this process, their steps alternating."""
    x, y = batch(model_name, batch_size, **overrides)
    runs = {}
    for arm in arms:
        model, trainable = build(arm, model_name, rank, **overrides)
        runs[arm] = (model, torch.optim.AdamW(trainable, lr=1e-4))
        train_step(*runs[arm], x, y)  # warm-up: kernels chosen, optimiser state allocated
    seconds: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(repeats):
        for arm, (model, optimizer) in runs.items():
            start = time.perf_counter()
            train_step(model, optimizer, x, y)
            seconds[arm].append(time.perf_counter() - start)
    return {arm: statistics.median(s) for arm, s in seconds.items()}


def arithmetic(rank: int = 8, names: tuple[str, ...] = BIG) -> list[dict]:
    """Training-state bytes before activations, from the parameter counts of timm's configs (built on the meta
    device: no memory): full fine-tuning's 16 per parameter (fp32 weights, gradients, AdamW's two moments) against
    LoRA on q and v (the frozen base's 4, or 2 in bf16, plus 16 per adapter parameter; the head left out)."""
    import timm

    rows = []
    for name in names:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, num_classes=0)
        params, width, depth = sum(p.numel() for p in model.parameters()), model.embed_dim, len(model.blocks)
        adapters = depth * 2 * rank * 2 * width  # q and v in each block: A (r, width) and B (width, r)
        rows.append({"model": name, "params": params, "adapters": adapters, "full_bytes": 16 * params,
                     "lora_bytes": 4 * params + 16 * adapters, "lora_bf16_base_bytes": 2 * params + 16 * adapters,
                     "full_checkpoint_bytes": 12 * params, "lora_checkpoint_bytes": 12 * adapters})
    return rows


def print_arithmetic(rows: list[dict], rank: int) -> None:
    print(f"training state before activations, full fine-tuning against LoRA r={rank} on q, v (GB):")
    for r in rows:
        print(f"  {r['model']:<26} {r['params'] / 1e6:>7.0f}M params, {r['adapters'] / 1e6:.2f}M adapters: "
              f"full {r['full_bytes'] / 1e9:6.2f}, LoRA {r['lora_bytes'] / 1e9:6.2f} (bf16 base "
              f"{r['lora_bf16_base_bytes'] / 1e9:5.2f}); checkpoint {r['full_checkpoint_bytes'] / 1e9:.2f} GB against "
              f"{r['lora_checkpoint_bytes'] / 1e6:.1f} MB")


def cpu() -> str:
    from vit.deploy.cpu import describe_cpu

    name = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")), platform.processor())
    return f"{name}, {torch.get_num_threads()} threads, flags: {describe_cpu()}"


def ratios(result: dict) -> dict:
    """The issue's bars, from the figures."""
    arms, out = result["arms"], {}
    if "full" in arms and "lora_qv" in arms:
        full, lora = arms["full"], arms["lora_qv"]
        out = {"optimizer_share": lora["optimizer_bytes"] / full["optimizer_bytes"],
               "peak_share": lora["peak_mib"] / full["peak_mib"], "step_share": lora["step_s"] / full["step_s"]}
    for ours, theirs in (("lora_qkv", "peft_lora_qkv"), ("lora_qv", "peft_lora_qkv"), ("dora_qkv", "peft_dora_qkv")):
        if ours in arms and theirs in arms:
            out[f"{ours}_vs_{theirs}"] = arms[ours]["step_s"] / arms[theirs]["step_s"]
    return out


def report(result: dict) -> None:
    print(f"{result['model']}, batch {result['batch_size']}, rank {result['rank']}, one AdamW training step on "
          f"the CPU ({result['cpu']}; torch {result['torch']}, peft {result['peft']}):")
    print(f"  {'arm':<14} {'trainable':>11} {'peak MiB':>9} {'optim MB':>9} {'ckpt MB':>8} {'step s':>7}")
    for arm, a in result["arms"].items():
        print(f"  {arm:<14} {a['trainable']:>11,} {a['peak_mib']:>9.0f} {a['optimizer_bytes'] / 1e6:>9.2f} "
              f"{a['checkpoint_bytes'] / 1e6:>8.2f} {a['step_s']:>7.2f}")
    r = result["ratios"]
    if "step_share" in r:
        print(f"  LoRA r={result['rank']} (q,v) against full: optimiser state {r['optimizer_share']:.2%} (bar <= 2%), "
              f"peak memory {r['peak_share']:.2f}x (bar < 1), step time {r['step_share']:.2f}x (bar <= 0.8)")
    for key, value in r.items():
        if "_vs_" in key:
            print(f"  {key.replace('_vs_', ' against ')}: step time {value:.2f}x (bar <= 1)")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per arm, after one warm-up")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--arm", choices=list(ARMS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--arithmetic", action="store_true", help="only the bytes of ViT-B, L, g and 7B, by formula")
    args = parser.parse_args(argv)
    if args.arithmetic:
        rows = arithmetic(args.rank)
        print_arithmetic(rows, args.rank)
        return {"arithmetic": rows}
    if args.arm:  # a child process: one arm's memory
        Path(args.out).write_text(json.dumps(measure_memory(args.arm, args.model, args.batch_size, args.rank)))
        return {}
    arms: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in args.arms:
            out = Path(tmp) / f"{arm}.json"
            subprocess.run([sys.executable, __file__, "--model", args.model, "--batch_size", str(args.batch_size),
                            "--rank", str(args.rank), "--arm", arm, "--out", str(out)], check=True)
            arms[arm] = json.loads(out.read_text())
    for arm, seconds in measure_time(args.arms, args.model, args.batch_size, args.rank, args.repeats).items():
        arms[arm]["step_s"] = seconds
    import peft

    result = {"model": args.model, "batch_size": args.batch_size, "rank": args.rank, "repeats": args.repeats,
              "cpu": cpu(), "torch": torch.__version__, "peft": peft.__version__, "arms": arms}
    result["ratios"] = ratios(result)
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
