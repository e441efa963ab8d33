"""What MAE's masking saves: one MAE training step against one supervised step of the same ViT encoder.

Both steps are whole training steps on one batch: forward, loss, backward and the (fused) AdamW update. The
supervised step is `vit fit`'s (every token through the encoder, cross-entropy on 1,000 classes); the MAE
step is `vit pretrain`'s (the encoder on the visible quarter of the tokens, the decoder on all of them, the
loss on the masked patches). Each is timed as the median of ``--steps`` steps after one warm-up step.

    flock /tmp/cpu.lock python scripts/benchmark_mae.py                     # ViT-B/16, batch 16, CPU
    python scripts/benchmark_mae.py --device cuda --batch 256 --dtype bf16

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

from vit import create_model
from vit.tasks import MaskedAutoencoder


def timed(step: Callable[[], None], steps: int, device: torch.device) -> float:
    """Median seconds of ``step`` over ``steps`` runs, after one warm-up run."""
    times = []
    for i in range(steps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


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


def main(argv: list[str] | None = None) -> dict[str, float]:
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
    updates: list[float] = []
    base = timed(training_step(supervised, lambda: F.cross_entropy(supervised(images), labels), dtype, device,
                               updates), args.steps, device)
    base_update = statistics.median(updates[1:])
    supervised = None  # its memory, before the MAE models
    print(f"{args.model}, batch {args.batch}, {args.device} {args.dtype}, threads {torch.get_num_threads()}:")
    print(f"  supervised step (all {tokens} patch tokens):  {base:.3f} s ({base_update:.3f} s of it the AdamW update)")
    ratios = {}
    for spec in args.decoders:
        width, depth, heads = map(int, spec.split(","))
        mae = MaskedAutoencoder(model=args.model, mask_ratio=args.mask_ratio, decoder_dim=width, decoder_depth=depth,
                                decoder_heads=heads, figure_images=0).to(device)
        updates = []
        seconds = timed(training_step(mae, lambda m=mae: m(images)[0], dtype, device, updates), args.steps, device)
        update = statistics.median(updates[1:])
        ratios[spec] = seconds / base
        print(f"  MAE step, {mae.visible} visible tokens, decoder {width} wide x {depth} deep: {seconds:.3f} s "
              f"= {ratios[spec]:.2f}x the supervised step; without the updates {(seconds - update):.3f} s "
              f"= {(seconds - update) / (base - base_update):.2f}x")
        mae = None
    return ratios


if __name__ == "__main__":
    main()
