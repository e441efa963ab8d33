"""A known answer offline for zero-shot classification: a tiny CLIP trained from scratch on captions of
scikit-learn's digits, scored zero-shot on the digits' test split with prompt templates it never saw in training;
then `head_init: zeroshot` fine-tuning against a random head, and WiSE-FT (`vit average`) between the zero-shot
and the fine-tuned classifier. Seeds 0-2; the table goes in docs/zeroshot.md.

    python scripts/experiments/digits_clip.py [--seeds 0 1 2] [--out runs/digits_clip] [--epochs 30]

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
from lightning.pytorch.callbacks import Callback

import vit
from vit.checkpoints.average import average_checkpoints
from vit.checkpoints.io import save_checkpoint
from vit.checkpoints.meta import classifier_checkpoint
from vit.data.captions import CaptionTable
from vit.data.digits import DIGITS_MEAN, DIGITS_STD, Digits, DigitsSet
from vit.deploy import load_classifier
from vit.tasks import ImageClassifier, Optimization
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
TOWER = {**VISION_KWARGS, "proj_dim": 64, "normalize_embedding": True}  # the classifier of that image tower


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
                         batch_size=32)
    seed_everything(seed, verbose=False)
    task = ContrastiveTask(vision="vit_digits_patch2_8", vision_kwargs=VISION_KWARGS, img_size=8, in_chans=1,
                           text=TEXT, embed_dim=64, context_length=40, lr=2e-3, weight_decay=0.05, warmup_epochs=1)
    trainer(root, epochs).fit(task, table)
    return task.eval()


class TestEachEpoch(Callback):
    """Top-1 on the test split after every training epoch (the evaluated weights), for epochs-to-accuracy."""

    def __init__(self, test: DigitsSet) -> None:
        self.test, self.curve = test, []

    def on_train_epoch_end(self, trainer: Trainer, module: ImageClassifier) -> None:
        self.curve.append(top1(module.eval_model, self.test))
        module.train()


def fine_tune(data: Digits, seed: int, clip_path: Path, head: str, epochs: int) -> tuple[list[float], dict]:
    """`vit fit` of the CLIP's image tower on the digits' labels from the zero-shot head ("zeroshot") or a random
    one ("random": the zero-shot start with the head re-initialised as a new network's); the test top-1 after
    each epoch, and the final weights as a classifier checkpoint."""
    (clip_path.parent / "held_out.txt").write_text("\n".join(HELD_OUT) + "\n")
    seed_everything(seed, verbose=False)
    task = ImageClassifier(model="vit_digits_patch2_8", model_kwargs=TOWER, num_classes=10,
                           class_names=data.class_names, mean=DIGITS_MEAN, std=DIGITS_STD, interpolation="bilinear",
                           pretrained=str(clip_path), head_init=f"zeroshot:{clip_path.parent / 'held_out.txt'}",
                           optim=Optimization(lr=5e-4, warmup_epochs=1, weight_decay=0.05))
    task.configure_model()
    if head == "random":
        fresh = vit.create_model("vit_digits_patch2_8", **TOWER, num_classes=10)
        task.model.head.load_state_dict(fresh.head.state_dict())
    curve = TestEachEpoch(data.test_set)
    run = Trainer(default_root_dir=clip_path.parent, accelerator="cpu", max_epochs=epochs, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  num_sanity_val_steps=0, callbacks=[curve])
    run.fit(task, data)
    return curve.curve, classifier_checkpoint(task.checkpoint_meta(), task.eval_model.state_dict())


def epochs_to(curve: list[float], target: float) -> int | None:
    """The first epoch (1-based) whose test top-1 reaches ``target``; None if none does."""
    return next((i + 1 for i, acc in enumerate(curve) if acc >= target), None)


def run_seed(seed: int, out: Path, epochs: int, ft_epochs: int) -> dict[str, float]:
    """One seed: zero-shot top-1 with held-out templates, the two fine-tunes, and WiSE-FT at alpha 0.5."""
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
    folder = out / f"seed{seed}"
    zs_curve, zs_ft = fine_tune(data, seed, folder / "clip.ckpt", "zeroshot", ft_epochs)
    rnd_curve, _ = fine_tune(data, seed, folder / "clip.ckpt", "random", ft_epochs)
    save_checkpoint(zs_ft, folder / "finetuned.ckpt")
    save_checkpoint(average_checkpoints([folder / "zeroshot.ckpt", folder / "finetuned.ckpt"], 0.5),
                    folder / "wise.ckpt")
    target = min(zs_curve[-1], rnd_curve[-1]) - 0.005  # the accuracy both reach (to half a point)
    result |= {"ft_zeroshot_head": zs_curve[-1], "ft_random_head": rnd_curve[-1],
               "wise_ft_0.5": top1(load_classifier(folder / "wise.ckpt").model, data.test_set),
               "target": target, "epochs_zeroshot_head": epochs_to(zs_curve, target),
               "epochs_random_head": epochs_to(rnd_curve, target), "curve_zeroshot_head": zs_curve,
               "curve_random_head": rnd_curve, "seconds": time.perf_counter() - start}
    print(json.dumps(result), flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/digits_clip")
    parser.add_argument("--epochs", type=int, default=30, help="epochs of the contrastive training")
    parser.add_argument("--ft_epochs", type=int, default=10, help="epochs of each fine-tune")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a shared 2-core machine: two threads a process thrashed (40 s an epoch, not 5)
    results = [run_seed(seed, Path(args.out), args.epochs, args.ft_epochs) for seed in args.seeds]
    for key in ("zeroshot_top1", "zeroshot_top1_train_template", "ft_zeroshot_head", "ft_random_head", "wise_ft_0.5"):
        values = [r[key] for r in results]
        print(f"{key}: mean {sum(values) / len(values):.3f} ({', '.join(f'{v:.3f}' for v in values)})")
    print("| seed | zero-shot (held-out templates) | fine-tuned, zero-shot head | fine-tuned, random head | "
          "WiSE-FT 0.5 | epochs to target: zero-shot head / random head (target) | seconds |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['seed']} | {r['zeroshot_top1']:.3f} | {r['ft_zeroshot_head']:.3f} | {r['ft_random_head']:.3f} | "
              f"{r['wise_ft_0.5']:.3f} | {r['epochs_zeroshot_head']} / {r['epochs_random_head']} ({r['target']:.3f}) | "
              f"{r['seconds']:.0f} |")
    return results


if __name__ == "__main__":
    main()
