"""A known answer offline for zero-shot classification: a tiny CLIP trained from scratch on captions of
scikit-learn's digits, scored zero-shot on the digits' test split with prompt templates it never saw in training;
then `head_init: zeroshot` fine-tuning against a random head, and WiSE-FT (`vit average`) between the zero-shot
and the fine-tuned classifier. Seeds 0-2; the table and the ablation go in docs/zeroshot.md.

    python scripts/experiments/digits_clip.py --seeds 0 1 2   # the measured run; --help lists the ablation's switches

Every training image gets a caption row per template of TEN_TEMPLATES + MORE_TEMPLATES (38), the digit as a
numeral or a word ("a handwritten 7", "the digit seven", ...); `CaptionTable` pairs it with one of them per visit,
drawn anew each epoch (``--captions one``: one caption per image drawn once, as before). The contrastive batches
hold ten different digits (`DistinctDigits`; ``--no-distinct --batch 32`` for plain shuffled batches). The
zero-shot classifier is built from HELD_OUT templates filled with the class names the data carries ("0".."9"):
"a picture of 7"; no training caption holds a held-out phrasing or its words (asserted below). About 60-85 s a
seed with one torch thread on the shared 2-core machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import Callback
from torch.utils.data import BatchSampler, DataLoader

import vit
from vit.checkpoints.average import average_checkpoints
from vit.checkpoints.io import save_checkpoint
from vit.checkpoints.meta import classifier_checkpoint
from vit.data.captions import CaptionSampler, CaptionTable
from vit.data.digits import DIGITS_MEAN, DIGITS_STD, Digits, DigitsSet
from vit.deploy import load_classifier
from vit.tasks import ImageClassifier, Optimization
from vit.tasks.contrastive import ContrastiveTask, zeroshot_classifier

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# {n}: the numeral, {w}: the word. Training captions only: none of these is a HELD_OUT template (checked below).
TEN_TEMPLATES = ("a handwritten {n}", "the digit {w}", "a small drawing of the number {w}", "the number {n}",
                 "a scan of a handwritten {w}", "{n}", "a {w}", "an 8x8 image of the digit {n}",
                 "someone wrote a {w}", "a blurry {n}")
MORE_TEMPLATES = ("an image of {n}", "a drawing of a {n}", "the digit {n}", "the number {w}", "a handwritten {w}",
                  "{w}", "a {n}", "an image of the number {w}", "a sketch of the digit {n}", "a low resolution {n}",
                  "a pixelated {w}", "a scan of the digit {n}", "a grey {n} on black", "digit {n}", "number {w}",
                  "handwriting: {n}", "it shows a {w}", "somebody drew a {n}", "a tiny {n}", "a written {w}",
                  "a scribbled {n}", "an old scan of a {n}", "a neat {n}", "a messy {w}", "the figure {n}",
                  "a {n} drawn by hand", "a close-up of a {n}", "a faint {w}")
HELD_OUT = ("a picture of {}", "a photo of the digit {}", "this is a {}")
# Held out means held out: no training template holds a held-out phrasing or one of its own words.
HELD_OUT_WORDS = ("picture", "photo", "this")
assert not any(h.replace("{}", "").strip() in t or w in t.split() for t in TEN_TEMPLATES + MORE_TEMPLATES
               for h in HELD_OUT for w in HELD_OUT_WORDS)
# The tiny CLIP: the digits ViT at width 64 and depth 4 with a 64-wide projection; a 2-block text tower.
VISION_KWARGS = {"embed_dim": 64, "depth": 4, "num_heads": 4}
TEXT = {"embed_dim": 64, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0}
TOWER = {**VISION_KWARGS, "proj_dim": 64, "normalize_embedding": True}  # the classifier of that image tower


def captions(label: int, templates: Sequence[str]) -> list[str]:
    """The training captions of a digit, one per template."""
    return [t.format(n=label, w=WORDS[label]) for t in templates]


def write_table(dataset: DigitsSet, folder: Path, templates: Sequence[str], rng: random.Random | None) -> Path:
    """The split's images as PNG files and a captions.csv (path,caption) beside them: a row per template and
    image (`CaptionTable` draws one per visit), or with ``rng`` one caption per image drawn once."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "captions.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "caption"])
        for i in range(len(dataset)):
            name = f"{dataset.indices[i]}.png"
            dataset.raw_image(i).save(folder / name)
            texts = captions(int(dataset.labels[i]), templates)
            writer.writerows([name, text] for text in ([rng.choice(texts)] if rng else texts))
    return folder / "captions.csv"


class DistinctDigits(BatchSampler):
    """Batches of ``batch_size`` different digits, so InfoNCE's batch holds no second image of a caption's
    class to push away. Takes `CaptionSampler`'s epoch-carrying order (Lightning sets ``sampler``'s epoch):
    each batch takes the next image of the digits with the most left, then the batches are shuffled."""

    def __init__(self, sampler: CaptionSampler, labels: Sequence[int], batch_size: int) -> None:
        super().__init__(sampler, batch_size, drop_last=True)
        self.labels = list(labels)
        counts = sorted(Counter(self.labels).values())
        self.batches = 0  # what the greedy draw yields depends on the counts alone
        while len(counts) >= batch_size:
            counts = sorted([c - 1 for c in counts[-batch_size:] if c > 1] + counts[:-batch_size])
            self.batches += 1

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[list[int]]:
        queues: dict[int, list[int]] = {}
        for index in self.sampler:
            queues.setdefault(self.labels[index % len(self.labels)], []).append(index)
        batches = []
        for _ in range(self.batches):
            fullest = sorted(queues, key=lambda digit: (-len(queues[digit]), digit))[: self.batch_size]
            batches.append([queues[digit].pop() for digit in fullest])
        random.Random(f"batches:{self.sampler.seed}:{self.sampler.epoch}").shuffle(batches)
        return iter(batches)


class DigitCaptions(CaptionTable):
    """`CaptionTable` with, when ``distinct``, `DistinctDigits` batches (the digit read from the image's file
    name, the dataset index)."""

    def __init__(self, *args: object, labels: dict[int, int], distinct: bool, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.labels, self.distinct = labels, distinct

    def train_dataloader(self) -> DataLoader:
        if not self.distinct:
            return super().train_dataloader()
        train = self.splits["train"]
        digits = [self.labels[int(path.stem)] for path, _ in train.images]
        batches = DistinctDigits(CaptionSampler(len(train), self.hp.seed), digits, self.hp.batch_size)
        return DataLoader(train, batch_sampler=batches)


def trainer(root: Path, epochs: int, callbacks: Sequence[Callback] = ()) -> Trainer:
    """A quiet CPU trainer that keeps no checkpoint files."""
    return Trainer(default_root_dir=root, accelerator="cpu", max_epochs=epochs, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   num_sanity_val_steps=0, callbacks=list(callbacks))


class ZeroShotEachEpoch(Callback):
    """The held-out templates' zero-shot top-1 on the test split after every contrastive epoch: the curve."""

    def __init__(self, data: Digits) -> None:
        self.data, self.curve = data, []

    def on_train_epoch_end(self, trainer: Trainer, task: ContrastiveTask) -> None:
        classifier = zeroshot_classifier(task.clip.eval(), task.tokenizer, self.data.class_names, HELD_OUT)
        self.curve.append(round(top1(classifier, self.data.test_set), 3))
        task.clip.train()


@torch.no_grad()
def top1(model: torch.nn.Module, dataset: DigitsSet) -> float:
    """Top-1 of a classifier on a digits split."""
    x = torch.stack([dataset[i][0] for i in range(len(dataset))])
    return float((model.eval()(x).argmax(-1) == dataset.labels).float().mean())


def train_clip(data: Digits, seed: int, root: Path, args: argparse.Namespace) -> ContrastiveTask:
    """The tiny CLIP from scratch on the training split's captions (the val split's for its val loss)."""
    templates = TEN_TEMPLATES + (MORE_TEMPLATES if args.templates == "many" else ())
    rng = random.Random(seed)
    train = write_table(data.train_set, root / "train", templates, rng if args.captions == "one" else None)
    val = write_table(data.val_set, root / "val", templates, rng)
    labels = dict(zip(data.train_set.indices, data.train_set.labels.tolist(), strict=True))
    table = DigitCaptions(str(train), str(val), img_size=8, in_chans=1, mean=DIGITS_MEAN, std=DIGITS_STD,
                          batch_size=args.batch, seed=seed, labels=labels, distinct=args.distinct)
    seed_everything(seed, verbose=False)
    task = ContrastiveTask(vision="vit_digits_patch2_8", vision_kwargs=VISION_KWARGS, img_size=8, in_chans=1,
                           text=TEXT, embed_dim=64, context_length=40 if args.tokenizer == "char" else 16,
                           lr=args.lr, weight_decay=0.05, warmup_epochs=1, tokenizer=args.tokenizer)
    curve = ZeroShotEachEpoch(data)
    trainer(root, args.epochs, [curve]).fit(task, table)
    task.zeroshot_curve = curve.curve
    return task.eval()


class TestEachEpoch(Callback):
    """Top-1 on the test split after every training epoch (the evaluated weights), for epochs-to-accuracy."""

    def __init__(self, test: DigitsSet) -> None:
        self.test, self.curve = test, []

    def on_train_epoch_end(self, trainer: Trainer, module: ImageClassifier) -> None:
        self.curve.append(top1(module.eval_model, self.test))
        module.train()


def fine_tune(data: Digits, seed: int, clip_path: Path, head: str, args: argparse.Namespace
              ) -> tuple[list[float], dict]:
    """`vit fit` of the CLIP's image tower on the digits' labels from the zero-shot head ("zeroshot") or a random
    one ("random": the zero-shot start with the head re-initialised as a new network's), both arms with the same
    optimisation; the test top-1 before training and after each epoch, and the final weights as a classifier
    checkpoint."""
    (clip_path.parent / "held_out.txt").write_text("\n".join(HELD_OUT) + "\n")
    seed_everything(seed, verbose=False)
    task = ImageClassifier(model="vit_digits_patch2_8", model_kwargs=TOWER, num_classes=10,
                           class_names=data.class_names, mean=DIGITS_MEAN, std=DIGITS_STD, interpolation="bilinear",
                           pretrained=str(clip_path), head_init=f"zeroshot:{clip_path.parent / 'held_out.txt'}",
                           optim=Optimization(lr=args.ft_lr, warmup_epochs=args.ft_warmup, weight_decay=0.05,
                                              layer_decay=args.layer_decay))
    task.configure_model()
    if head == "random":
        fresh = vit.create_model("vit_digits_patch2_8", **TOWER, num_classes=10)
        task.model.head.load_state_dict(fresh.head.state_dict())
    curve = TestEachEpoch(data.test_set)
    curve.curve.append(top1(task.model, data.test_set))  # epoch 0: the start
    task.model.train()
    run = Trainer(default_root_dir=clip_path.parent, accelerator="cpu", max_epochs=args.ft_epochs, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  num_sanity_val_steps=0, callbacks=[curve])
    run.fit(task, data)
    return curve.curve, classifier_checkpoint(task.checkpoint_meta(), task.eval_model.state_dict())


def epochs_to(curve: list[float], target: float) -> int | None:
    """The first epoch whose test top-1 reaches ``target`` (0: the start already does); None if none does."""
    return next((i for i, acc in enumerate(curve) if acc >= target), None)


def run_seed(seed: int, out: Path, args: argparse.Namespace) -> dict[str, float]:
    """One seed: zero-shot top-1 with held-out templates, the two fine-tunes, and WiSE-FT at alpha 0.5."""
    data = Digits(seed=seed)
    data.setup("fit")
    start = time.perf_counter()
    task = train_clip(data, seed, out / f"seed{seed}" / "clip", args)
    classifier = zeroshot_classifier(task.clip, task.tokenizer, data.class_names, HELD_OUT)
    seen = zeroshot_classifier(task.clip, task.tokenizer, data.class_names, ("a handwritten {}",))
    result = {"seed": seed, "zeroshot_top1": top1(classifier, data.test_set),
              "zeroshot_top1_train_template": top1(seen, data.test_set),
              "zeroshot_curve": task.zeroshot_curve, "clip_seconds": time.perf_counter() - start}
    meta = {"task": "classify", "model_name": "vit_digits_patch2_8", "model_config": classifier.config.to_dict(),
            "class_names": data.class_names, "mean": list(DIGITS_MEAN), "std": list(DIGITS_STD), "crop_pct": 1.0,
            "interpolation": "bilinear"}
    save_checkpoint(classifier_checkpoint(meta, classifier.state_dict()), out / f"seed{seed}" / "zeroshot.ckpt")
    save_checkpoint({"vit": task.checkpoint_meta(), "state_dict": {f"clip.{k}": v for k, v in
                                                                   task.clip.state_dict().items()}},
                    out / f"seed{seed}" / "clip.ckpt")
    folder = out / f"seed{seed}"
    if not args.ft_epochs:
        print(json.dumps(result), flush=True)
        return result
    zs_curve, zs_ft = fine_tune(data, seed, folder / "clip.ckpt", "zeroshot", args)
    rnd_curve, _ = fine_tune(data, seed, folder / "clip.ckpt", "random", args)
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


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The experiment's settings (docs/zeroshot.md names the measured ones)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/digits_clip")
    parser.add_argument("--epochs", type=int, default=30, help="epochs of the contrastive training")
    parser.add_argument("--templates", choices=("ten", "many"), default="many",
                        help="TEN_TEMPLATES, or those and MORE_TEMPLATES")
    parser.add_argument("--captions", choices=("one", "all"), default="all",
                        help="one caption per image drawn once, or every template's (one drawn per visit)")
    parser.add_argument("--tokenizer", choices=("char", "word"), default="char",
                        help="the text tower reads characters, or the training captions' words")
    parser.add_argument("--batch", type=int, default=10, help="contrastive batch size")
    parser.add_argument("--distinct", action=argparse.BooleanOptionalAction, default=True,
                        help="batches of different digits (batch <= 10)")
    parser.add_argument("--lr", type=float, default=2e-3, help="contrastive peak lr")
    parser.add_argument("--ft_epochs", type=int, default=10, help="epochs of each fine-tune (0: none)")
    parser.add_argument("--ft_lr", type=float, default=5e-4, help="both fine-tunes' peak lr (the head's)")
    parser.add_argument("--ft_warmup", type=float, default=0.0, help="both fine-tunes' warm-up epochs")
    parser.add_argument("--layer_decay", type=float, default=0.75,
                        help="both fine-tunes' layer-wise lr decay (1: every layer at the head's lr)")
    args = parser.parse_args(argv)
    if args.distinct and args.batch > 10:
        parser.error(f"--distinct needs --batch <= 10 (ten digits), got {args.batch}")
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    args = parse(argv)
    torch.set_num_threads(1)  # a shared 2-core machine: two threads a process thrashed (40 s an epoch, not 5)
    results = [run_seed(seed, Path(args.out), args) for seed in args.seeds]
    keys = ("zeroshot_top1", "zeroshot_top1_train_template", "ft_zeroshot_head", "ft_random_head", "wise_ft_0.5",
            "seconds")
    for key in (k for k in keys if k in results[0]):
        values = [r[key] for r in results]
        mean = sum(values) / len(values)
        spread = (sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)) ** 0.5
        print(f"{key}: mean {mean:.3f} sd {spread:.3f} ({', '.join(f'{v:.3f}' for v in values)})")
    if not args.ft_epochs:
        return results
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
