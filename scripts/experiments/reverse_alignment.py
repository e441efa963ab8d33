"""The reversal task's known answer: does each output token's cross-attention sit on the mirrored source token?

Scores a checkpoint of `vit fit --config configs/translate_reverse.yaml` on held-out sequences (seeded, drawn
apart from the recipe's seed): alignment accuracy, the share of output tokens whose cross-attention argmax
over the source is the mirrored position S-1-t, for every decoder layer and head and for the heads' mean, with
teacher forcing and at each greedy step. Prints a markdown table; ``--figures DIR`` draws the alignment of the
best head and of the mean, the three kinds' layers x heads grids and the top source tokens of one sentence;
``--fixture PATH`` writes the checkpoint's weights in float16 without the optimizer state (the small file the
notebook test runs on).

    python scripts/experiments/reverse_alignment.py --ckpt logs/translate_reverse/checkpoints/last.ckpt \
        --figures docs/figures
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from vit.data.synthetic import synthetic_pairs
from vit.explain.text import (
    mirrored_alignment_accuracy,
    plot_alignment,
    plot_heads,
    plot_top_sources,
    translation_attention,
)
from vit.tasks import Translator, load_task

EXAMPLE = "4 1 7 19 3 12 8 0 15 6 11"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True, type=Path, help="a reversal checkpoint from `vit fit`")
    parser.add_argument("--num", type=int, default=1000, help="held-out sequences to score (default: 1000)")
    parser.add_argument("--figures", type=Path, default=None, help="folder for the figures")
    parser.add_argument("--fixture", type=Path, default=None, help="write a float16 weights-only copy here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    translator = load_task(args.ckpt, Translator)
    sources = [source for source, _ in synthetic_pairs("reverse", args.num, seed=12345)]
    print(f"{args.ckpt}: {args.num} held-out sequences of 5-15 symbols")
    print("| capture | best head (layer, head) | its accuracy | head mean, per decoder layer |")
    print("|---|---|---:|---|")
    best = None
    for decode in (False, True):
        per_head, head_mean = mirrored_alignment_accuracy(translator, sources, decode=decode)
        layer, head = divmod(int(per_head.argmax()), per_head.shape[1])
        best = best or (layer, head)
        means = ", ".join(f"{v:.3f}" for v in head_mean.tolist())
        print(f"| {'greedy steps' if decode else 'teacher forcing'} | ({layer}, {head}) | "
              f"{per_head[layer, head]:.3f} | {means} |")
        print("  per layer x head: " + "; ".join(", ".join(f"{v:.3f}" for v in row) for row in per_head.tolist()))
    if args.figures is not None:
        args.figures.mkdir(parents=True, exist_ok=True)
        att = translation_attention(translator, EXAMPLE)
        print(f"{EXAMPLE!r} -> {att.translation!r}")
        plot_alignment(att, best[0], best[1]).savefig(args.figures / "reverse_alignment_best_head.png", dpi=110)
        plot_alignment(att, -1, "mean").savefig(args.figures / "reverse_alignment_mean.png", dpi=110)
        plot_top_sources(att, best[0], best[1], k=3).savefig(args.figures / "reverse_top_sources.png", dpi=100)
        for kind in ("encoder", "decoder", "cross"):
            plot_heads(att, kind).savefig(args.figures / f"reverse_{kind}_heads.png", dpi=80)
        print(f"wrote figures to {args.figures}")
    if args.fixture is not None:
        checkpoint = torch.load(args.ckpt, map_location="cpu", weights_only=True)
        keep = ("state_dict", "hyper_parameters", "vit", "pytorch-lightning_version", "epoch", "global_step")
        small = {key: checkpoint[key] for key in keep if key in checkpoint}
        small["state_dict"] = {k: v.half() if v.is_floating_point() else v for k, v in small["state_dict"].items()}
        torch.save(small, args.fixture)
        print(f"wrote {args.fixture} ({args.fixture.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
