"""Write OpenAI CLIP's tokenizer files (vocab.json, merges.txt) from the open_clip package, offline.

open_clip ships the BPE vocabulary inside the package (bpe_simple_vocab_16e6.txt.gz) and its SimpleTokenizer has no
save_pretrained; `vit zeroshot --tokenizer DIR` and a CLIP folder read the hub's files instead. This writes them:

    pip install open_clip_torch   # once, on any machine
    python scripts/dev/clip_tokenizer_files.py --out clip_tokenizer
    vit zeroshot --model my_clip.pt --tokenizer clip_tokenizer --classes "oak,maple,birch" --out zs
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def write_clip_tokenizer(out: Path) -> list[Path]:
    """vocab.json (token -> id) and merges.txt (ranked, with the `#version` line the hub's files start with)."""
    from open_clip.tokenizer import SimpleTokenizer

    tokenizer = SimpleTokenizer()
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps(tokenizer.encoder), encoding="utf-8")
    merges = sorted(tokenizer.bpe_ranks.items(), key=lambda kv: kv[1])
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for (a, b), _ in merges),
                                    encoding="utf-8")
    return [out / "vocab.json", out / "merges.txt"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the folder to write vocab.json and merges.txt to")
    args = parser.parse_args(argv)
    for path in write_clip_tokenizer(Path(args.out)):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
