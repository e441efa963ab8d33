"""`vit average --ckpt A --ckpt B [--ckpt C ...] [--alpha 0.5] --out OUT.ckpt`: weight-space averages of
classifier checkpoints of one architecture and one class list (`vit.checkpoints.average`).

Two checkpoints and ``--alpha``: WiSE-FT, ``(1 - alpha) * A + alpha * B`` (A the zero-shot or starting model,
B the fine-tuned one). Without ``--alpha``: a uniform soup of all of them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line of `vit average`."""
    parser = argparse.ArgumentParser(
        prog="vit average", description="Average the weights of classifier checkpoints of one architecture and one "
        "class list: WiSE-FT between two (--alpha), or a uniform soup of several. Writes a checkpoint that every "
        "command reads (predict, serve, export, attention).")
    parser.add_argument("--ckpt", action="append", required=True, metavar="CKPT",
                        help="a classifier checkpoint (`vit fit`, `vit probe`, `vit zeroshot`); give it 2+ times")
    parser.add_argument("--alpha", type=float, default=None,
                        help="two checkpoints only: the second's share, (1 - alpha) * A + alpha * B (WiSE-FT; "
                             "0.5 is the paper's usual choice). Left out: every checkpoint weighs the same")
    parser.add_argument("--out", required=True, help="the checkpoint to write (e.g. wise.ckpt)")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str]) -> Path:
    """Run `vit average` with the given arguments (without the command name); returns the written file."""
    from vit.checkpoints.average import average_checkpoints
    from vit.checkpoints.io import save_checkpoint

    args = parse_args(argv)
    checkpoint = average_checkpoints(args.ckpt, args.alpha)
    out = save_checkpoint(checkpoint, args.out)
    mix = ", ".join(f"{s['weight']:.3g} x {s['path']}" for s in checkpoint["averaged_from"])
    print(f"{out}: {mix} ({len(checkpoint['vit']['class_names'])} classes)")
    return out
