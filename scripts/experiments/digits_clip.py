"""A known answer offline for zero-shot classification: a tiny CLIP trained from scratch on captions of
scikit-learn's digits, scored zero-shot on the digits' test split with prompt templates it never saw in training;
then `head_init: zeroshot` fine-tuning against a random head, and WiSE-FT (`vit average`) between the zero-shot
and the fine-tuned classifier. Seeds 0-2; the table goes in docs/zeroshot.md.

    python scripts/experiments/digits_clip.py [--seeds 0 1 2] [--out runs/digits_clip] [--quick]

Each image gets one caption drawn (seeded) from TRAIN_TEMPLATES, with the digit as a numeral or a word
("a handwritten 7", "the digit seven", ...). The zero-shot classifier is built from HELD_OUT templates filled with
the class names the data carries ("0".."9"): "a picture of 7". About 3-4 minutes of CPU per seed on 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from lightning.pytorch import Trainer, seed_everything

from vit.checkpoints.io import save_checkpoint
from vit.checkpoints.meta import classifier_checkpoint
from vit.data.captions import CaptionTable
from vit.data.digits import DIGITS_MEAN, DIGITS_STD, Digits, DigitsSet
from vit.tasks.contrastive import ContrastiveTask, zeroshot_classifier

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# {n}: the numeral, {w}: the word. Training captions only: none of these is a HELD_OUT template.
TRAIN_TEMPLATES = ("a handwritten {n}", "the digit {w}", "a small drawing of the number {w}", "the number {n}",
                   "a scan of a handwritten {w}", "{n}", "a {w}", "an 8x8 image of the digit {n}",
                   "someone wrote a {w}", "a blurry {n}")
HELD_OUT = ("a picture of {}", "a photo of the digit {}", "this is a {}")
# The tiny CLIP: the digits ViT at width 64 and depth 4 with a 64-wide projection; a 2-block text tower.
VISION_KWARGS = {"embed_dim": 64, "depth": 4, "num_heads": 4}
TEXT = {"embed_dim": 64, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0}


def caption(label: int, rng: random.Random) -> str:
    """One training caption of a digit."""
    return rng.choice(TRAIN_TEMPLATES).format(n=label, w=WORDS[label])


def write_table(dataset: DigitsSet, folder: Path, rng: random.Random) -> Path:
    """The split's images as PNG files and a captions.csv (path,caption) beside them."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "captions.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "caption"])
        for i in range(len(dataset)):
            name = f"{dataset.indices[i]}.png"
            dataset.raw_image(i).save(folder / name)
            writer.writerow([name, caption(int(dataset.labels[i]), rng)])
    return folder / "captions.csv"


def trainer(root: Path, epochs: int) -> Trainer:
    """A quiet CPU trainer that keeps no checkpoint files."""
    return Trainer(default_root_dir=root, accelerator="cpu", max_epochs=epochs, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   num_sanity_val_steps=0)


@torch.no_grad()
def top1(model: torch.nn.Module, dataset: DigitsSet) -> float:
    """Top-1 of a classifier on a digits split."""
    x = torch.stack([dataset[i][0] for i in range(len(dataset))])
    return float((model.eval()(x).argmax(-1) == dataset.labels).float().mean())


def train_clip(data: Digits, seed: int, root: Path, epochs: int) -> ContrastiveTask:
    """The tiny CLIP from scratch on the training split's captions (the val split's for its val loss)."""
    rng = random.Random(seed)
    train, val = write_table(data.train_set, root / "train", rng), write_table(data.val_set, root / "val", rng)
    table = CaptionTable(str(train), str(val), img_size=8, in_chans=1, mean=DIGITS_MEAN, std=DIGITS_STD,
                         batch_size=64)
    seed_everything(seed, verbose=False)
    task = ContrastiveTask(vision="vit_digits_patch2_8", vision_kwargs=VISION_KWARGS, img_size=8, in_chans=1,
                           text=TEXT, embed_dim=64, context_length=40, lr=2e-3, weight_decay=0.05, warmup_epochs=2)
    trainer(root, epochs).fit(task, table)
    return task.eval()


def run_seed(seed: int, out: Path, epochs: int) -> dict[str, float]:
    """One seed: zero-shot top-1 with held-out templates, and the zero-shot checkpoint written."""
    data = Digits(seed=seed)
    data.setup("fit")
    start = time.perf_counter()
    task = train_clip(data, seed, out / f"seed{seed}" / "clip", epochs)
    classifier = zeroshot_classifier(task.clip, task.tokenizer, data.class_names, HELD_OUT)
    seen = zeroshot_classifier(task.clip, task.tokenizer, data.class_names, ("a handwritten {}",))
    result = {"seed": seed, "zeroshot_top1": top1(classifier, data.test_set),
              "zeroshot_top1_train_template": top1(seen, data.test_set), "clip_seconds": time.perf_counter() - start}
    meta = {"task": "classify", "model_name": "vit_digits_patch2_8", "model_config": classifier.config.to_dict(),
            "class_names": data.class_names, "mean": list(DIGITS_MEAN), "std": list(DIGITS_STD), "crop_pct": 1.0,
            "interpolation": "bilinear"}
    save_checkpoint(classifier_checkpoint(meta, classifier.state_dict()), out / f"seed{seed}" / "zeroshot.ckpt")
    save_checkpoint({"vit": task.checkpoint_meta(), "state_dict": {f"clip.{k}": v for k, v in
                                                                   task.clip.state_dict().items()}},
                    out / f"seed{seed}" / "clip.ckpt")
    print(json.dumps(result), flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/digits_clip")
    parser.add_argument("--epochs", type=int, default=30, help="epochs of the contrastive training")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    results = [run_seed(seed, Path(args.out), args.epochs) for seed in args.seeds]
    mean = sum(r["zeroshot_top1"] for r in results) / len(results)
    print(f"zero-shot top-1 (held-out templates), mean of {len(results)} seeds: {mean:.3f}")
    return results


if __name__ == "__main__":
    main()
