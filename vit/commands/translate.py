"""`vit translate --ckpt CHECKPOINT "a sentence" ...` or `--file lines.txt`: print one translation a line.

``--alignment`` follows each translation with one line per output token: the source tokens its
cross-attention weighs most (the last decoder layer's head mean), e.g. ``3 <- 3 (0.97)``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options of `vit translate`."""
    parser = argparse.ArgumentParser(
        prog="vit translate",
        description="Translate sentences with a checkpoint from `vit fit` with a Translator; one line out per line in.",
    )
    parser.add_argument("sentences", nargs="*", help="sentences to translate")
    parser.add_argument("--ckpt", required=True, help="checkpoint written by `vit fit` with a Translator")
    parser.add_argument("--file", help="translate every line of this UTF-8 file ('-' reads stdin)")
    parser.add_argument("--beam_size", type=int, default=None, help="1 = greedy (default: as trained)")
    parser.add_argument("--length_penalty", type=float, default=None, help="beam search length penalty")
    parser.add_argument("--max_length", type=int, default=None, help="most tokens to generate")
    parser.add_argument("--batch_size", type=int, default=64, help="sentences per batch (default: %(default)s)")
    parser.add_argument("--alignment", action="store_true",
                        help="after each translation, print each output token's most-attended source tokens")
    parser.add_argument("--alignment_top", type=int, default=1, help="source tokens per output token with --alignment")
    args = parser.parse_args(list(argv))
    if args.batch_size < 1:
        parser.error(f"--batch_size must be 1 or more, got {args.batch_size}")
    if args.file:
        from vit.data.corpus import decode_lines

        if args.file != "-" and not Path(args.file).is_file():
            parser.error(f"--file {args.file!r} not found")
        data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
        # one line out per line in: the lines as the training corpus splits them, checked as UTF-8 before any work
        args.sentences += decode_lines(data, "stdin" if args.file == "-" else args.file,
                                       fix="re-encode it as UTF-8 (iconv -f latin1 -t utf-8)")
    if not args.sentences:
        parser.error("give sentences to translate, or --file")
    return args


def main(argv: Sequence[str]) -> list[str]:
    """Run `vit translate` with the given arguments (without the command name); returns the translations."""
    args = parse_args(argv)
    from tqdm import tqdm

    from vit.tasks import Translator, load_task  # the model lives in the LightningModule

    translator = load_task(args.ckpt, Translator)
    if args.alignment:
        return _print_alignments(translator, args)
    decoding = dict(beam_size=args.beam_size, length_penalty=args.length_penalty, max_len=args.max_length)
    sentences, out = args.sentences, []
    chunks = range(0, len(sentences), args.batch_size)
    for start in tqdm(chunks, desc="translating", file=sys.stderr, disable=len(chunks) < 2):
        batch = sentences[start : start + args.batch_size]
        for line in translator.translate(batch, batch_size=args.batch_size, **decoding):
            print(line)
            out.append(line)
    return out


def _print_alignments(translator, args: argparse.Namespace) -> list[str]:
    """`--alignment`: one sentence at a time, each translation followed by its cross-attention alignment."""
    from vit.explain.text import alignment_text, translation_attention

    hp = translator.hparams
    beam_size = args.beam_size or (hp.beam_size if hp.decoding == "beam" else 1)
    max_len = hp.max_decode_length if args.max_length is None else args.max_length
    out = []
    for sentence in args.sentences:
        if not translator.source_tokenizer.encode(sentence):  # an empty line stays empty, as without --alignment
            print("")
            out.append("")
            continue
        att = translation_attention(translator, sentence, beam_size=beam_size, max_len=max_len)
        print(att.translation)
        for line in alignment_text(att, k=args.alignment_top).splitlines():
            print(f"    {line}")
        out.append(att.translation)
    return out
