"""`vit attention --ckpt translate.ckpt --text "4 1 7 19 3"`: where the translation model looks.

For each sentence it writes ``<out>/<n>_alignment.png`` (cross-attention, target × source), and
``<out>/<n>_<kind>_heads.png`` (layers × heads) with ``--heads``, and one ``<out>/attention.json``
holding every sentence's token labels and weights: ``{"text", "translation", "mode", "source",
"target", "target_inputs", "encoder", "decoder", "cross"}``, each weight list [layer][head][row][column].
`vit attention` hands over here when it sees ``--text``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from vit.errors import UserValueError


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options of `vit attention --text`."""
    parser = argparse.ArgumentParser(
        prog="vit attention --text",
        description="Draw a translation checkpoint's attention for each sentence: an alignment PNG, and a JSON "
        "of the encoder, decoder and cross-attention weights with their token labels.",
    )
    parser.add_argument("--ckpt", required=True, type=Path, help="checkpoint written by `vit fit` with a Translator")
    parser.add_argument("--text", nargs="+", required=True, help="source sentences")
    parser.add_argument("--target", nargs="+", default=None,
                        help="reference translations, one per --text: teacher forcing instead of decoding")
    parser.add_argument("--beam_size", type=int, default=1, help="1 = greedy (default); more = beam search")
    parser.add_argument("--max_length", type=int, default=None, help="most tokens to generate")
    parser.add_argument("--layer", type=int, default=-1, help="decoder layer of the alignment (default: last)")
    parser.add_argument("--head", default="mean", help="head of the alignment, or 'mean' (default)")
    parser.add_argument("--heads", nargs="*", choices=("encoder", "decoder", "cross"), default=None,
                        help="also draw a layers x heads grid of these kinds")
    parser.add_argument("--out", type=Path, default=Path("attention_maps"), help="output folder (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    args = parser.parse_args(list(argv))
    if args.target is not None and len(args.target) != len(args.text):
        parser.error(f"--target gives {len(args.target)} sentences for {len(args.text)} --text sentences")
    if args.beam_size < 1:
        parser.error(f"--beam_size must be at least 1, got {args.beam_size}")
    if args.head != "mean":
        try:
            args.head = int(args.head)
        except ValueError:
            parser.error(f"--head takes a head number or 'mean', got {args.head!r}")
    return args


def main(argv: Sequence[str]) -> list[dict]:
    """Run `vit attention --text ...` (without the command name); returns the JSON records."""
    args = parse_args(argv)
    from vit.explain.text import plot_alignment, plot_heads, translation_attention
    from vit.tasks import Translator, load_task

    translator = load_task(args.ckpt, Translator, map_location=args.device)
    heads = translator.model.decoder[0].cross_attn.num_heads
    layers = len(translator.model.decoder)
    if not -heads <= (0 if args.head == "mean" else args.head) < heads:
        raise UserValueError(f"--head {args.head}: the model has {heads} heads (0..{heads - 1}) or 'mean'")
    if not -layers <= args.layer < layers:
        raise UserValueError(f"--layer {args.layer}: the decoder has {layers} layers (0..{layers - 1})")
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for n, text in enumerate(args.text):
        target = None if args.target is None else args.target[n]
        try:
            att = translation_attention(translator, text, target, beam_size=args.beam_size, max_len=args.max_length)
        except ValueError as error:
            raise UserValueError(f"--text {text!r}: {error}") from None
        png = args.out / f"{n}_alignment.png"
        plot_alignment(att, args.layer, args.head).savefig(png, dpi=120)
        for kind in args.heads or []:
            plot_heads(att, kind).savefig(args.out / f"{n}_{kind}_heads.png", dpi=100)
        records.append({"text": text, "png": str(png), **att.to_dict()})
        print(f"{text!r} -> {att.translation!r} ({att.mode}) -> {png}")
    summary = args.out / "attention.json"
    summary.write_text(json.dumps(records))
    print(f"wrote {len(records)} alignment figure(s) and {summary}")
    return records
