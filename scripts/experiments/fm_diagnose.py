"""Where a function-matching student stands against its teacher (issue 66's diagnosis): on the labelled train
images, the unlabelled pool and the test split, each model's top-1 against the true labels and the student's
agreement with its teacher's top class, all at the evaluation transform.

    python scripts/experiments/fm_diagnose.py --data WORK/mnist5k/data --dataset mnist5k \
        --teacher T.ckpt --student S.ckpt [S2.ckpt ...]

The pool's true labels come from the source data set (the PNG's name is its index there); no training reads them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from PIL import Image


def load(paths: list[Path], classifier) -> torch.Tensor:
    transform = classifier.eval_transform()
    return torch.stack([transform(Image.open(p).convert(classifier.image_mode)) for p in paths])


@torch.no_grad()
def predict(classifier, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([classifier(x[i:i + 500]).argmax(-1) for i in range(0, len(x), 500)])


def splits(data: Path, dataset: str) -> dict[str, tuple[list[Path], torch.Tensor]]:
    from distill_unlabelled import images_of

    _, truth = images_of(dataset)
    out = {}
    for name, folder in (("train", data / "labelled" / "train"), ("pool", data / "pool"),
                         ("test", data / "labelled" / "test")):
        paths = sorted(folder.rglob("*.png"))
        out[name] = (paths, torch.as_tensor([int(truth[int(p.stem)]) for p in paths]))
    return out


def diagnose(data: Path, dataset: str, teacher: Path, students: list[Path]) -> dict[str, dict[str, float]]:
    from vit.deploy.classifier import read_classifier

    torch.set_num_threads(2)
    models = {"teacher": read_classifier(teacher), **{str(s): read_classifier(s) for s in students}}
    names = models["teacher"].class_names
    report: dict[str, dict[str, float]] = {}
    for split, (paths, truth) in splits(data, dataset).items():
        x = load(paths, models["teacher"])
        answers = {k: torch.as_tensor([int(names[i]) for i in predict(m, x)]) for k, m in models.items()}
        for k, a in answers.items():
            row = report.setdefault(k, {})
            row[f"{split}_acc"] = round(float((a == truth).float().mean()), 4)
            if k != "teacher":
                row[f"{split}_agree"] = round(float((a == answers["teacher"]).float().mean()), 4)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--student", type=Path, nargs="+", required=True)
    args = parser.parse_args()
    for name, row in diagnose(args.data, args.dataset, args.teacher, args.student).items():
        print(json.dumps({"model": name, **row}))
