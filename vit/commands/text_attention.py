"""`vit attention --ckpt translate.ckpt --text "4 1 7 19 3"`: where the translation model looks.

For each sentence it writes ``<out>/<n>_alignment.png`` (cross-attention, target × source), and
``<out>/<n>_<kind>_heads.png`` (layers × heads) with ``--heads``, and one ``<out>/attention.json``
holding every sentence's token labels and weights: ``{"text", "translation", "mode", "source",
"target", "target_inputs", "encoder", "decoder", "cross"}``, each weight list [layer][head][row][column].
Every file is written atomically. `vit attention` parses the options (this module adds the group of its own)
and runs `run` when ``--text`` is given.
"""

from __future__ import annotations

import argparse
import json

from vit.errors import UserValueError
from vit.files import save_atomic

OPTIONS = ("target", "beam_size", "max_length", "heads")  # the options of this mode alone (argparse dests)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options of `vit attention --text`, as a group of `vit attention`'s parser."""
    group = parser.add_argument_group("--text: a translation checkpoint's attention (and --layer, --head)")
    group.add_argument("--target", nargs="+", default=None, metavar="SENTENCE",
                       help="reference translations, one per --text: teacher forcing instead of decoding")
    group.add_argument("--beam_size", type=int, default=1, help="1 = greedy (default); more = beam search")
    group.add_argument("--max_length", type=int, default=None, help="most tokens to generate")
    group.add_argument("--heads", nargs="*", choices=("encoder", "decoder", "cross"), default=None,
                       help="also draw a layers x heads grid of these kinds")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what cannot run in `vit attention --text`; ``args.layer`` and ``args.head`` become one each."""
    if args.images:
        parser.error(f"--text draws a translation checkpoint's attention on sentences, not on image files "
                     f"({', '.join(map(str, args.images[:3]))}); give the sentences after --text, in quotes")
    if args.target is not None and len(args.target) != len(args.text):
        parser.error(f"--target gives {len(args.target)} sentences for {len(args.text)} --text sentences")
    if args.beam_size < 1:
        parser.error(f"--beam_size must be at least 1, got {args.beam_size}")
    if args.layer is not None and len(args.layer) > 1:
        parser.error(f"--text draws one decoder layer's alignment: give one --layer, got {args.layer}")
    if args.head is not None and len(args.head) > 1:
        parser.error(f"--text draws one head's alignment, or their mean: give one --head, got {args.head}")
    args.layer = -1 if args.layer is None else args.layer[0]
    args.head = "mean" if args.head is None else args.head[0]
    if args.head != "mean":
        try:
            args.head = int(args.head)
        except ValueError:
            parser.error(f"--head takes a head number or 'mean', got {args.head!r}")


def run(args: argparse.Namespace) -> list[dict]:
    """Run `vit attention --text ...` on parsed (and checked) options; returns the JSON records."""
    from vit.explain.text import plot_alignment, plot_heads, translation_attention
    from vit.tasks import Translator, load_task

    translator = load_task(args.ckpt, Translator, map_location=args.device)
    heads = translator.model.decoder[0].cross_attn.num_heads
    layers = len(translator.model.decoder)
    if not -heads <= (0 if args.head == "mean" else args.head) < heads:
        raise UserValueError(f"--head {args.head}: the model has {heads} heads (0..{heads - 1}) or 'mean'")
    if not -layers <= args.layer < layers:
        raise UserValueError(f"--layer {args.layer}: the decoder has {layers} layers (0..{layers - 1})")
    records = []
    for n, text in enumerate(args.text):
        target = None if args.target is None else args.target[n]
        try:
            att = translation_attention(translator, text, target, beam_size=args.beam_size, max_len=args.max_length)
        except ValueError as error:
            raise UserValueError(f"--text {text!r}: {error}") from None
        png = args.out / f"{n}_alignment.png"
        figure = plot_alignment(att, args.layer, args.head)
        save_atomic(lambda f, figure=figure: figure.savefig(f, format="png", dpi=120), png)
        for kind in args.heads or []:
            figure = plot_heads(att, kind)
            save_atomic(lambda f, figure=figure: figure.savefig(f, format="png", dpi=100),
                        args.out / f"{n}_{kind}_heads.png")
        records.append({"text": text, "png": str(png), **att.to_dict()})
        print(f"{text!r} -> {att.translation!r} ({att.mode}) -> {png}")
    summary = save_atomic(lambda f: f.write(json.dumps(records).encode()), args.out / "attention.json")
    print(f"wrote {len(records)} alignment figure(s) and {summary}")
    return records
