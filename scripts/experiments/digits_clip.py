"""A known answer offline for zero-shot classification: a tiny CLIP trained from scratch on captions of
scikit-learn's digits, scored zero-shot on the digits' test split with prompt templates it never saw in training;
then `head_init: zeroshot` fine-tuning against a random head, what the recipe keeps (`keep_better`: the fine-tune
only where it beats the zero-shot start on validation), and WiSE-FT (`vit average`) between the zero-shot and the
fine-tuned classifier. Seeds 0-2; the table and the ablation go in docs/zeroshot.md.

    python scripts/experiments/digits_clip.py --seeds 0 1 2           # the measured run; --help lists the switches
    python scripts/experiments/digits_clip.py --seeds 0 1 2 --reuse   # the fine-tunes again on the saved CLIPs

Every training image gets a caption row per template of TEN_TEMPLATES + MORE_TEMPLATES (38), the digit as a
numeral or a word ("a handwritten 7", "the digit seven", ...); `CaptionTable` pairs it with one of them per visit,
drawn anew each epoch (``--captions one``: one caption per image drawn once, as before). The contrastive batches
hold ten different digits (`DistinctDigits`; ``--no-distinct --batch 32`` for plain shuffled batches). The
zero-shot classifier is built from HELD_OUT templates filled with the class names the data carries ("0".."9"):
"a picture of 7"; no training caption holds a held-out phrasing or its words (asserted below). The fine-tunes
train on the plain images the contrastive training saw (``--ft_affine``: with `Digits`' random affine, which cost
the fine-tune from the zero-shot head 7 points; scripts/experiments/digits_clip_finetune.py measures each cause).
About 100-110 s a seed with one torch thread on the shared 2-core machine (the CLIP 70-85 s of it); with ``--reuse``
about 25 s.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
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
from vit.nn.clip import CLIP
from vit.preprocessing import Preprocessing
from vit.tasks import ImageClassifier, Optimization
from vit.tasks.contrastive import ContrastiveTask, load_contrastive, zeroshot_classifier
from vit.tasks.heads import SingleLabelHead

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
NO_AFFINE = {"max_shift": 0.0, "max_rotation": 0.0, "zoom": (1.0, 1.0)}  # `Digits` without its random affine


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


class EachEpoch(Callback):
    """Validation and test top-1 of the evaluated weights: the start (`record`, before fit) and every epoch's end."""

    def __init__(self, data: Digits) -> None:
        self.data, self.val, self.test = data, [], []

    def record(self, model: torch.nn.Module) -> None:
        self.val.append(top1(model, self.data.val_set))
        self.test.append(top1(model, self.data.test_set))

    def on_train_epoch_end(self, trainer: Trainer, module: ImageClassifier) -> None:
        self.record(module.eval_model)
        module.train()


def keep_better(val: Sequence[float]) -> int:
    """The recipe's rule for a fine-tune from the zero-shot head: keep the fine-tuned end (-1) only when it scores
    higher on validation than the start (0), else the zero-shot classifier; a tie keeps the start."""
    return -1 if val[-1] > val[0] else 0


def fine_tune_data(seed: int, affine: bool) -> Digits:
    """The fine-tunes' digits: the seed's split, its training images without the random affine unless ``affine``
    (the contrastive training saw its images plain; with the affine the fine-tune fell 7 points below its start)."""
    data = Digits(seed=seed, **({} if affine else NO_AFFINE))
    data.setup("fit")
    return data


def fine_tune(seed: int, clip_path: Path, head: str, args: argparse.Namespace) -> tuple[EachEpoch, dict]:
    """`vit fit` of the CLIP's image tower on the digits' labels from the zero-shot head ("zeroshot") or a random
    one ("random": the zero-shot start with the head re-initialised as a new network's), both arms with the same
    optimisation and data (the random affine off unless ``--ft_affine``: the contrastive training saw none); the
    val and test top-1 before training and after each epoch, and the final weights as a classifier checkpoint."""
    (clip_path.parent / "held_out.txt").write_text("\n".join(HELD_OUT) + "\n")
    data = fine_tune_data(seed, args.ft_affine)
    seed_everything(seed, verbose=False)
    task = ImageClassifier(model="vit_digits_patch2_8", model_kwargs=TOWER, num_classes=10,
                           class_names=data.class_names, pretrained=str(clip_path),
                           head_init=f"zeroshot:{clip_path.parent / 'held_out.txt'}",
                           preprocessing=Preprocessing(DIGITS_MEAN, DIGITS_STD, interpolation="bilinear"),
                           head=SingleLabelHead(label_smoothing=args.ft_smoothing),
                           optim=Optimization(lr=args.ft_lr, warmup_epochs=args.ft_warmup, weight_decay=0.05,
                                              layer_decay=args.layer_decay))
    task.configure_model()
    if head == "random":
        fresh = vit.create_model("vit_digits_patch2_8", **TOWER, num_classes=10)
        task.model.head.load_state_dict(fresh.head.state_dict())
    else:  # the zero-shot head's logits times a factor (1: the CLIP's own scale, exp(logit_scale))
        with torch.no_grad():
            task.model.head.weight.mul_(args.ft_head_scale)
            task.model.head.bias.mul_(args.ft_head_scale)
    curves = EachEpoch(data)
    curves.record(task.model)  # epoch 0: the start
    task.model.train()
    run = Trainer(default_root_dir=clip_path.parent, accelerator="cpu", max_epochs=args.ft_epochs, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  num_sanity_val_steps=0, limit_val_batches=0, callbacks=[curves])
    run.fit(task, data)
    return curves, classifier_checkpoint(task.checkpoint_meta(), task.eval_model.state_dict())


def epochs_to(curve: list[float], target: float) -> int | None:
    """The first epoch whose test top-1 reaches ``target`` (0: the start already does); None if none does."""
    return next((i for i, acc in enumerate(curve) if acc >= target), None)


def clip_of(data: Digits, seed: int, folder: Path, args: argparse.Namespace) -> tuple[CLIP, object, list | None]:
    """The seed's trained CLIP and tokenizer (and its zero-shot curve): trained and saved as clip.ckpt, or with
    ``--reuse`` read back from a clip.ckpt an earlier run saved (no curve then)."""
    if args.reuse and (folder / "clip.ckpt").is_file():
        clip, tokenizer = load_contrastive(folder / "clip.ckpt")
        return clip, tokenizer, None
    task = train_clip(data, seed, folder / "clip", args)
    save_checkpoint({"vit": task.checkpoint_meta(), "state_dict": {f"clip.{k}": v for k, v in
                                                                   task.clip.state_dict().items()}},
                    folder / "clip.ckpt")
    return task.clip, task.tokenizer, task.zeroshot_curve


def run_seed(seed: int, out: Path, args: argparse.Namespace) -> dict[str, float]:
    """One seed: zero-shot top-1 with held-out templates, the two fine-tunes, what the recipe keeps of the
    zero-shot head's (`keep_better`), and WiSE-FT at alpha 0.5."""
    data = Digits(seed=seed)
    data.setup("fit")
    start, folder = time.perf_counter(), out / f"seed{seed}"
    clip, tokenizer, curve = clip_of(data, seed, folder, args)
    classifier = zeroshot_classifier(clip, tokenizer, data.class_names, HELD_OUT)
    seen = zeroshot_classifier(clip, tokenizer, data.class_names, ("a handwritten {}",))
    result = {"seed": seed, "zeroshot_top1": top1(classifier, data.test_set),
              "zeroshot_top1_train_template": top1(seen, data.test_set),
              "zeroshot_curve": curve, "clip_seconds": time.perf_counter() - start}
    meta = {"task": "classify", "model_name": "vit_digits_patch2_8", "model_config": classifier.config.to_dict(),
            "class_names": data.class_names, "mean": list(DIGITS_MEAN), "std": list(DIGITS_STD), "crop_pct": 1.0,
            "interpolation": "bilinear"}
    save_checkpoint(classifier_checkpoint(meta, classifier.state_dict()), folder / "zeroshot.ckpt")
    if not args.ft_epochs:
        print(json.dumps(result), flush=True)
        return result
    zs, zs_ft = fine_tune(seed, folder / "clip.ckpt", "zeroshot", args)
    rnd, _ = fine_tune(seed, folder / "clip.ckpt", "random", args)
    save_checkpoint(zs_ft, folder / "finetuned.ckpt")
    kept = keep_better(zs.val)
    shutil.copyfile(folder / ("finetuned.ckpt" if kept else "zeroshot.ckpt"), folder / "kept.ckpt")
    save_checkpoint(average_checkpoints([folder / "zeroshot.ckpt", folder / "finetuned.ckpt"], 0.5),
                    folder / "wise.ckpt")
    target = min(zs.test[-1], rnd.test[-1]) - 0.005  # the accuracy both reach (to half a point)
    result |= {"ft_zeroshot_head": zs.test[-1], "ft_random_head": rnd.test[-1], "kept": zs.test[kept],
               "kept_is": "fine-tuned" if kept else "zero-shot", "val_start_end": [zs.val[0], zs.val[-1]],
               "wise_ft_0.5": top1(load_classifier(folder / "wise.ckpt").model, data.test_set),
               "target": target, "epochs_zeroshot_head": epochs_to(zs.test, target),
               "epochs_random_head": epochs_to(rnd.test, target), "curve_zeroshot_head": zs.test,
               "curve_random_head": rnd.test, "seconds": time.perf_counter() - start}
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
    parser.add_argument("--reuse", action="store_true",
                        help="read each seed's CLIP from OUT/seedS/clip.ckpt when an earlier run saved it")
    parser.add_argument("--ft_epochs", type=int, default=20, help="epochs of each fine-tune (0: none)")
    parser.add_argument("--ft_affine", action=argparse.BooleanOptionalAction, default=False,
                        help="the fine-tunes' data with Digits' random affine (the contrastive training has none)")
    parser.add_argument("--ft_lr", type=float, default=5e-4, help="both fine-tunes' peak lr (the head's)")
    parser.add_argument("--ft_warmup", type=float, default=1.0, help="both fine-tunes' warm-up epochs")
    parser.add_argument("--layer_decay", type=float, default=0.75,
                        help="both fine-tunes' layer-wise lr decay (1: every layer at the head's lr)")
    parser.add_argument("--ft_smoothing", type=float, default=0.1, help="both fine-tunes' label smoothing")
    parser.add_argument("--ft_head_scale", type=float, default=1.0,
                        help="the zero-shot head's weight and bias times this at the fine-tune's start")
    args = parser.parse_args(argv)
    if args.distinct and args.batch > 10:
        parser.error(f"--distinct needs --batch <= 10 (ten digits), got {args.batch}")
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    args = parse(argv)
    torch.set_num_threads(1)  # a shared 2-core machine: two threads a process thrashed (40 s an epoch, not 5)
    results = [run_seed(seed, Path(args.out), args) for seed in args.seeds]
    keys = ("zeroshot_top1", "zeroshot_top1_train_template", "ft_zeroshot_head", "kept", "ft_random_head",
            "wise_ft_0.5", "seconds")
    for key in (k for k in keys if k in results[0]):
        values = [r[key] for r in results]
        mean = sum(values) / len(values)
        spread = (sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)) ** 0.5
        print(f"{key}: mean {mean:.3f} sd {spread:.3f} ({', '.join(f'{v:.3f}' for v in values)})")
    if not args.ft_epochs:
        return results
    print("| seed | zero-shot (held-out templates) | fine-tuned, zero-shot head | kept by validation | "
          "fine-tuned, random head | WiSE-FT 0.5 | epochs to target: zero-shot head / random head (target) | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        cells = (f"{r['zeroshot_top1']:.3f}", f"{r['ft_zeroshot_head']:.3f}", f"{r['kept']:.3f} ({r['kept_is']})",
                 f"{r['ft_random_head']:.3f}", f"{r['wise_ft_0.5']:.3f}",
                 f"{r['epochs_zeroshot_head']} / {r['epochs_random_head']} ({r['target']:.3f})", f"{r['seconds']:.0f}")
        print(f"| {r['seed']} | " + " | ".join(cells) + " |")
    return results


if __name__ == "__main__":
    main()
