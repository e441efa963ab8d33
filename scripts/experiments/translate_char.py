"""configs/translate_tsv.yaml on a character-level task: per-epoch val exact match, BLEU and chrF, and the best.

Writes a TSV of word pairs and runs `vit fit` on it with the recipe, ``tokenizer: char`` and any more options
given after the task's. Two tasks, both seeded:

* ``reverse``: 3,000 words of 3-9 letters a-z, each to its reversal; the recipe at embed_dim 64 (its 3 + 3
  layers). The learning-rate comparison of docs/translation.md.
* ``shift``: 400 words of 4-7 letters a-j, each letter moved 3 on; the tiny model of tests/tasks/test_translate.py
  (embed_dim 32, one layer each side, lr 0.005, 10 epochs). Its table of docs/translation.md.

    python scripts/experiments/translate_char.py reverse --out /tmp/lr --model.init_args.warmup_steps=320
    PYTHONPATH=../main python scripts/experiments/translate_char.py shift --out /tmp/before \
        --checkpoint.monitor=val_bleu      # main's code and recipe, before chrF (../main: a checkout of main)
"""

from __future__ import annotations

import argparse
import csv
import random
import shutil
import sys
import time
from pathlib import Path

from vit.cli.main import cli

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "translate_tsv.yaml"
TASKS = {
    "reverse": ["--model.init_args.embed_dim=64", "--trainer.max_epochs=24"],
    "shift": ["--model.init_args.embed_dim=32", "--model.init_args.num_heads=2",
              "--model.init_args.num_encoder_layers=1", "--model.init_args.num_decoder_layers=1",
              "--model.init_args.drop_rate=0.0", "--model.init_args.lr=0.005", "--model.init_args.warmup_steps=30",
              "--data.init_args.batch_size=16", "--data.init_args.val_fraction=0.15", "--trainer.max_epochs=10"],
}


def write_pairs(task: str, path: Path) -> None:
    """The task's pairs; ``shift`` writes what tests/tasks/test_translate.py's ``shifted_words`` writes (repeated
    here, so that this script runs on a tree without that test, e.g. main's before chrF, for the "before" figures)."""
    rng, words = random.Random(0), set()
    letters, (shortest, longest), count = (("abcdefghij", (4, 7), 400) if task == "shift"
                                           else ("abcdefghijklmnopqrstuvwxyz", (3, 9), 3000))
    while len(words) < count:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(shortest, longest))))
    shift = {c: letters[(i + 3) % len(letters)] for i, c in enumerate(letters)}
    target = (lambda w: "".join(shift[c] for c in w)) if task == "shift" else (lambda w: w[::-1])
    path.write_text("".join(f"{w}\t{target(w)}\n" for w in sorted(words)), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--out", type=Path, required=True, help="a folder for the data, logs and checkpoints")
    args, extra = parser.parse_known_args()
    sys.argv = sys.argv[:1]  # read here: LightningCLI warns when it is given both args and a command line
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    write_pairs(args.task, args.out / "pairs.tsv")
    start = time.perf_counter()
    run = cli(["fit", "--config", str(RECIPE), f"--trainer.default_root_dir={args.out}",
               f"--trainer.logger.init_args.save_dir={args.out}/logs", f"--checkpoint.dirpath={args.out}/ckpt",
               "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
               "--trainer.accelerator=cpu", f"--data.init_args.train={args.out / 'pairs.tsv'}",
               "--data.init_args.tokenizer=char", *TASKS[args.task], *extra])
    rows = [r for r in csv.DictReader((Path(run.trainer.logger.log_dir) / "metrics.csv").open())
            if r.get("val_exact_match")]
    hp = run.model.hparams
    print(f"{time.perf_counter() - start:.0f} s, {run.trainer.global_step} steps, lr {hp.lr}, warm-up "
          f"{hp.warmup_steps}, schedule {hp.lr_schedule}")
    for name in ("val_exact_match", "val_bleu", "val_chrf"):
        if name in rows[0]:  # (a tree before chrF has no val_chrf)
            print(f"{name:16}", " ".join(f"{float(r[name]):.3f}" for r in rows))
    print("best:", Path(run.best_checkpoint.best_model_path).name)


if __name__ == "__main__":
    main()
