"""Decoding speed of the text Transformer with attention capture off and on, and against another checkout.

Capture off must cost nothing: it runs the fused kernel exactly as before. ``--against PATH`` times the
same decoding with the `vit` package of another checkout (e.g. main before capture existed), in
alternating rounds so that a shared machine slows both alike. Each round runs in a fresh process per
tree; a row reports the minimum, median and maximum time per decode over ``--rounds`` rounds. The model is the reversal
recipe's size (configs/translate_reverse.yaml), randomly initialised and seeded: speed only.

    python scripts/bench/benchmark_text_attention.py
    python scripts/bench/benchmark_text_attention.py --against /work/main --rounds 7 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# One round in one process: build the model, warm up, time each decoding mode.
WORKER = r"""
import json, sys, time, torch
from vit.nn.text import Seq2SeqTransformer
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
torch.manual_seed(0)
model = Seq2SeqTransformer(src_vocab_size=24, tgt_vocab_size=24, embed_dim=64, num_heads=4, num_encoder_layers=2,
                           num_decoder_layers=2, drop_rate=0.0).eval()
src = torch.randint(4, 24, (cfg["batch"], cfg["length"]), generator=torch.Generator().manual_seed(1))
out = {}
for mode in cfg["modes"]:
    beam, capture = mode.split("/")
    kwargs = dict(bos_id=2, eos_id=3, max_len=cfg["length"] + 1)
    if capture == "on":
        kwargs["return_attention"] = True
    if beam == "greedy":
        run = lambda: model.greedy_decode(src, **kwargs)
    else:
        run = lambda: model.beam_search(src, beam_size=int(beam.removeprefix("beam")), **kwargs)
    run()  # warm-up
    start = time.perf_counter()
    for _ in range(cfg["repeats"]):
        run()
    out[mode] = (time.perf_counter() - start) / cfg["repeats"]
print(json.dumps(out))
"""


def one_round(tree: Path, cfg: dict) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(cfg)], env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, default=None, help="another checkout to time capture-off against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="decodes per round and mode")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=15, help="source length; decoding runs length + 1 steps")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    base = dict(batch=args.batch, length=args.length, repeats=args.repeats, threads=args.threads)
    modes = ["greedy/off", "greedy/on", "beam4/off", "beam4/on"]
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for name, mode_ in one_round(ROOT, {**base, "modes": modes}).items():
            times.setdefault(("this tree", name), []).append(mode_)
        if args.against is not None:
            for name, mode_ in one_round(args.against, {**base, "modes": ["greedy/off", "beam4/off"]}).items():
                times.setdefault((f"{args.against}", name), []).append(mode_)
    print(f"batch {args.batch} x {args.length} tokens, {args.threads} thread(s), median of {args.rounds} rounds "
          f"x {args.repeats} decodes")
    # The minimum is the round least disturbed by other work on the machine; the median shows the spread.
    print("| tree | decoding | capture | ms per decode, min | median | max |")
    print("|---|---|---|---:|---:|---:|")
    for (tree, name), values in times.items():
        decoding, capture = name.split("/")
        print(f"| {tree} | {decoding} | {capture} | {1000 * min(values):.1f} | "
              f"{1000 * statistics.median(values):.1f} | {1000 * max(values):.1f} |")


if __name__ == "__main__":
    main()
