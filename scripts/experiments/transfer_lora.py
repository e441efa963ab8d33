"""LoRA and DoRA against full fine-tuning and the linear probe, offline on a CPU: the transfer task of
`transfer_digits.py` (a small ViT pre-trained on digits 0-4 learns digits 5-9 from a few labelled images per
class), five ways, side by side:

    full           everything trains, layer-wise LR decay 0.75     (finetune: full)
    linear probe   the backbone frozen, a new head                  (finetune: linear_probe)
    LoRA r=8       adapters on q and v of every block, and the head (finetune: lora, rank 8, alpha 16)
    LoRA r=8 all   the same on every linear layer: q, k, v, proj, fc1, fc2 (QLoRA's all-linear setting)
    LoRA r=1       the same at rank 1 (alpha 2: the same alpha / r)
    DoRA r=8       LoRA r=8 with DoRA's per-row magnitudes          (finetune: dora)

Every arm runs the same steps on the same images with the same augmentation and gets the same tuning effort: its
learning rate is the best of the same number of grid points on a validation set of as many more labelled images
(LoRA's grid is a step higher, as the LoRA literature tunes it: its update starts at zero, scaled by alpha / r).
Test top-1 is on the digits test split of classes 5-9, for each draw of the labelled images (seeds).

Beside the accuracy, each arm's cost: the seconds of one fit, and the bytes of one training step, counted (the RSS
of one process cannot be split between arms): the weights, the trainable parameters' gradients and AdamW state,
and the tensors autograd saves for the backward pass (the activations; the weights it saves are not counted twice).

The backbone is pre-trained once per run and shared by the arms; ``--backbone FILE`` keeps it there, and a later
run with the same FILE reuses it (a run of some ``--methods`` then compares with an earlier one).

    python scripts/experiments/transfer_lora.py                   # about 5 minutes on 2 CPU cores
    python scripts/experiments/transfer_lora.py --seeds 0 1 2 3 4 --json transfer_lora.json
    python scripts/experiments/transfer_lora.py --backbone /tmp/digits_0_4.ckpt --methods full "LoRA r=8 all"
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch import seed_everything
from torch.utils.data import DataLoader, Dataset
from transfer_digits import MODEL, Relabelled, accuracy, pick, pretrain, trainer

from vit.data import Digits
from vit.tasks import ImageClassifier, Optimization
from vit.tasks.finetune import Adapters, Full, LinearProbe

FULL_GRID, LORA_GRID = (1e-3, 3e-3, 1e-2), (3e-3, 1e-2, 3e-2)
ALL_LINEAR = ["q", "k", "v", "proj", "fc1", "fc2"]
METHODS = {  # name: (ImageClassifier options, lr grid); layer_decay is an optimisation setting
    "full": ({"finetune": Full(), "layer_decay": 0.75}, FULL_GRID),
    "linear probe": ({"finetune": LinearProbe()}, FULL_GRID),
    "LoRA r=8": ({"finetune": Adapters(rank=8, alpha=16.0)}, LORA_GRID),
    "LoRA r=8 all": ({"finetune": Adapters(rank=8, alpha=16.0, targets=ALL_LINEAR)}, LORA_GRID),
    "LoRA r=1": ({"finetune": Adapters(rank=1, alpha=2.0)}, LORA_GRID),
    "DoRA r=8": ({"finetune": Adapters(rank=8, alpha=16.0, dora=True)}, LORA_GRID),
}


def learn(
    method: str, lr: float, pretrained: Path, train: Dataset, steps: int, root: Path, seed: int
) -> ImageClassifier:
    """One run of ``method`` on the labelled images of digits 5-9, seeded with ``seed`` (as transfer_digits.learn)."""
    seed_everything(seed, verbose=False)
    options = dict(METHODS[method][0])
    optim = Optimization(lr=lr, warmup_steps=steps // 10, min_lr=lr / 100, layer_decay=options.pop("layer_decay", None))
    model = ImageClassifier(model=MODEL, num_classes=5, optim=optim, pretrained=str(pretrained), **options)
    model.configure_model()  # load the 0-4 weights now (a Trainer would, but after the reset below)
    model.model.reset_classifier(5)  # the 0-4 head has the right shape, but means other classes
    trainer(steps, root).fit(model, DataLoader(train, batch_size=len(train), shuffle=True))
    return model


def step_bytes(model: ImageClassifier, train: Dataset) -> dict[str, int]:
    """What one training step on the whole labelled set holds, by part: the weights, the gradients and AdamW's two
    moments of what trains, and the tensors saved for backward that are not weights."""
    network = model.model
    params = list(network.parameters())
    trainable = [p for p in params if p.requires_grad]
    weights = {p.untyped_storage().data_ptr() for p in params}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    x, y = map(torch.stack, zip(*[(x, torch.tensor(y)) for x, y in train]))
    network.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(network(x), y)
    loss.backward()
    network.zero_grad(set_to_none=True)
    size = lambda ps: sum(p.numel() * p.element_size() for p in ps)
    return {"trainable": sum(p.numel() for p in trainable), "weights": size(params), "gradients": size(trainable),
            "optimizer": 2 * size(trainable), "activations": sum(saved.values())}


def run_arm(method: str, args: argparse.Namespace, checkpoint: Path, data: Digits, root: Path, test: Dataset) -> dict:
    """Every draw of ``method``: the lr chosen on val, its test top-1, and the cost of a fit and of a step."""
    runs, seconds, chosen = [], [], []
    memory: dict[str, int] = {}
    for seed in args.seeds:
        train = Relabelled(data.train_set, pick(data.train_set, range(5, 10), args.labels_per_class, seed), 5)
        val = Relabelled(data.val_set, pick(data.val_set, range(5, 10), args.labels_per_class, seed), 5)
        best = None
        for lr in METHODS[method][1]:
            start = time.perf_counter()
            model = learn(method, lr, checkpoint, train, args.steps, root, seed)
            seconds.append(time.perf_counter() - start)
            score = accuracy(model, val)
            if best is None or score > best[0]:
                best = (score, lr, model)
        runs.append(accuracy(best[2], test))
        chosen.append(best[1])
        memory = step_bytes(best[2], train)
        print(f"seed {seed}, {method:<12} lr {best[1]:g} (val {best[0]:.2f}): test top-1 {runs[-1]:.3f}")
    return {"mean": statistics.mean(runs), "stdev": statistics.stdev(runs) if len(runs) > 1 else 0.0,
            "runs": runs, "lrs": chosen, "fit_s": statistics.mean(seconds), **memory}


def report(summary: dict, args: argparse.Namespace, tested: int) -> None:
    print(f"\ndigits 5-9 from {args.labels_per_class} labelled images per class, {args.steps} steps each, "
          f"test top-1 over {len(args.seeds)} draws ({tested} test images); memory of one step in KB:")
    print(f"  {'arm':<12} {'top-1':>6} {'± sd':>6}  {'draws':<20} {'trains':>7} {'fit s':>6} {'grads+adam':>10} "
          f"{'activations':>11} {'total':>7}")
    for method, r in summary.items():
        total = r["weights"] + r["gradients"] + r["optimizer"] + r["activations"]
        print(f"  {method:<12} {r['mean']:>6.3f} {r['stdev']:>6.3f}  {', '.join(f'{v:.3f}' for v in r['runs']):<20} "
              f"{r['trainable']:>7,} {r['fit_s']:>6.1f} {(r['gradients'] + r['optimizer']) / 1e3:>10.0f} "
              f"{r['activations'] / 1e3:>11.0f} {total / 1e3:>7.0f}")


def pretrained_backbone(args: argparse.Namespace, data: Digits, root: Path) -> Path:
    """The backbone every arm starts from: ``--backbone`` if it is there, else pre-trained now (and kept there)."""
    if args.backbone is not None and args.backbone.is_file():
        print(f"the pre-trained backbone of an earlier run: {args.backbone}")
        return args.backbone
    checkpoint = pretrain(data, args.pretrain_epochs, root)
    if args.backbone is not None:
        args.backbone.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(checkpoint, args.backbone)
    return checkpoint


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labels_per_class", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100, help="optimiser steps for every arm")
    parser.add_argument("--pretrain_epochs", type=int, default=100, help="on digits 0-4 (100: test top-1 1.000)")
    parser.add_argument("--backbone", type=Path, default=None, help="keep the pre-trained backbone in this file, "
                        "or reuse it if the file is there")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="draws of the labelled images")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # this model is too small to gain from more
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no banner per run
    start = time.perf_counter()
    seed_everything(0, verbose=False)
    data = Digits(img_size=16)
    data.setup("fit")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = pretrained_backbone(args, data, root)
        test = Relabelled(data.test_set, pick(data.test_set, range(5, 10), None, 0), 5)
        summary = {m: run_arm(m, args, checkpoint, data, root, test) for m in args.methods}
    report(summary, args, len(test))
    print(f"in {time.perf_counter() - start:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
