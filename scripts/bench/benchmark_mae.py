"""What MAE's masking saves: one MAE training step against one supervised step of the same ViT encoder.

Both steps are whole training steps on one batch: forward, loss, backward and the (fused) AdamW update. The
supervised step is `vit fit`'s (every token through the encoder, cross-entropy on 1,000 classes); the MAE
step is `vit pretrain`'s (the encoder on the visible quarter of the tokens, the decoder on all of them, the
loss on the masked patches). Each kind is timed over ``--steps`` steps after a warm-up step, the kinds in
turns; the median of the turns' ratios counts.
Beside each time ratio is the ratio of the two steps' forward and backward FLOPs (torch's FlopCounterMode):
what the step would cost if every operation ran equally fast, the bound the decoder sets.

    flock /tmp/cpu.lock python scripts/bench/benchmark_mae.py                     # ViT-B/16, batch 16, CPU
    python scripts/bench/benchmark_mae.py --device cuda --batch 256 --dtype bf16

Decoders are given as width,depth,heads: the paper's ViT-B decoder is 512,8,16 (configs/pretrain/
mae_imagenet_vit_base.yaml); configs/pretrain/mae_folder_vit_base.yaml uses 512,4,16.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from vit import create_model
from vit.tasks import MaskedAutoencoder


def seconds(step: Callable[[], None], device: torch.device) -> float:
    """Wall-clock seconds of one call of ``step`` (the device synchronised on both sides)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def training_step(model: torch.nn.Module, loss_of: Callable[[], torch.Tensor], dtype: torch.dtype | None,
                  device: torch.device, update_times: list[float]) -> Callable[[], None]:
    """One optimiser step of ``model`` on the loss ``loss_of()`` computes (under autocast when ``dtype`` is set);
    the seconds of each AdamW update go to ``update_times``."""
    # the same optimiser for both, fused as `vit pretrain` has it: the update costs the same whatever the masking
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, betas=(0.9, 0.95),
                                  fused=True)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_of()
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        update_times.append(time.perf_counter() - start)

    return step


def step_flops(loss_of: Callable[[], torch.Tensor]) -> float:
    """Forward and backward FLOPs of one loss computation (the gradients it leaves are cleared by the next step)."""
    with FlopCounterMode(display=False) as counter:
        loss_of().backward()
    return float(counter.get_total_flops())


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="timed steps of each kind (their median counts)")
    parser.add_argument("--decoders", nargs="+", default=["512,8,16", "512,4,16"], help="width,depth,heads each")
    parser.add_argument("--mask_ratio", type=float, default=0.75)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else None
    torch.manual_seed(0)
    supervised = create_model(args.model, num_classes=1000).to(device)
    images = torch.randn(args.batch, supervised.in_chans, *supervised.img_size, device=device)
    labels = torch.randint(0, 1000, (args.batch,), device=device)
    tokens = supervised.patch_embed.num_patches
    models = {"supervised": supervised}
    losses = {"supervised": lambda: F.cross_entropy(supervised(images), labels)}
    visible = {}
    for spec in args.decoders:
        width, depth, heads = map(int, spec.split(","))
        mae = MaskedAutoencoder(model=args.model, mask_ratio=args.mask_ratio, decoder_dim=width, decoder_depth=depth,
                                decoder_heads=heads, figure_images=0).to(device)
        models[spec], losses[spec], visible[spec] = mae, (lambda m=mae: m(images)[0]), mae.visible
    updates: dict[str, list[float]] = {name: [] for name in losses}
    steps = {name: training_step(models[name], losses[name], dtype, device, updates[name]) for name in models}
    # in turns (supervised, each MAE, supervised, ...), so that a busy machine slows every kind alike
    times: dict[str, list[float]] = {name: [] for name in steps}
    for turn in range(args.steps + 1):
        for name, step in steps.items():
            t = seconds(step, device)
            if turn:  # the first turn warms up
                times[name].append(t)
    flops = {name: step_flops(loss) for name, loss in losses.items()}
    base, base_update = statistics.median(times["supervised"]), statistics.median(updates["supervised"][1:])
    print(f"{args.model}, batch {args.batch}, {args.device} {args.dtype}, threads {torch.get_num_threads()}, "
          f"median of {args.steps} steps each, taken in turns:")
    print(f"  supervised step (all {tokens} patch tokens): {base:.3f} s ({base_update:.3f} s of it the AdamW update), "
          f"{flops['supervised'] / 1e9:.0f} GFLOP")
    ratios, flop_ratios = {}, {}
    for spec in args.decoders:
        width, depth, _ = map(int, spec.split(","))
        step, update = statistics.median(times[spec]), statistics.median(updates[spec][1:])
        ratios[spec] = statistics.median(t / b for t, b in zip(times[spec], times["supervised"]))
        flop_ratios[spec] = flops[spec] / flops["supervised"]
        print(f"  MAE step, {visible[spec]} visible tokens, decoder {width} wide x {depth} deep: {step:.3f} s "
              f"= {ratios[spec]:.2f}x the supervised step (median of the turns' ratios); without the updates "
              f"{(step - update) / (base - base_update):.2f}x; FLOPs {flop_ratios[spec]:.2f}x")
    return {"time": ratios, "flops": flop_ratios}


if __name__ == "__main__":
    main()
