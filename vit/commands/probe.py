"""`vit probe`: a frozen-feature baseline to run before fine-tuning.

    vit probe --config configs/digits.yaml
    vit probe --config configs/imagenet_vit_small.yaml --data vit.data.ImageFolder --data.root photos/ \\
        --model.init_args.pretrained vit_small_patch16_224.augreg_in21k_ft_in1k
    vit probe --config configs/finetune/folder_dinov2_small.yaml --data.init_args.root photos/ \\
        --model.init_args.model_kwargs "{global_pool: token_avg}"   # DINOv2's own linear evaluation

Any family works: the features are what its head reads (the cls token; the patch mean for DINOv3 and SigLIP gap;
SigLIP's attention pool; DeiT distilled's two tokens' mean). ``global_pool: token_avg`` gives DINOv2's
MODEL_CARD.md features instead: the cls token concatenated with the mean patch token (2 x width), and the
saved checkpoint is built with that pooling, so it predicts with what the probe was fit on.

The model and data come from the same config and flags as `vit fit` (the trainer's are ignored).
The evaluated weights' pooled, pre-logits features of the train, val and test splits are extracted
once, the training split through the evaluation transform (no augmentation), and cached on disk under a
hash of the weights and the data. On them: a logistic regression (standardised features, C chosen on
val) and a cosine kNN (k chosen on val), whose val and test top-1 are printed. C and k are chosen on val
only, so the test figure comes from images that chose nothing; where the data has no test split apart
from val (e.g. ``test_fraction: 0``), only val figures are reported, and they say so. The backbone with
the logistic regression folded into its head (scaler included) is saved as a `vit fit`-format checkpoint
that `vit predict --ckpt`, `vit attention --ckpt` and ``--model.init_args.pretrained`` accept, in a run
folder next to `vit fit`'s runs of the same config: ``<logger save_dir>/<name>/probe/version_N/``.
The features, the two probes and the folded head are `vit.probe`'s; this command parses, calls and prints.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vit.checkpoints.io import save_checkpoint
from vit.checkpoints.meta import classifier_checkpoint
from vit.checkpoints.runs import new_run_folder
from vit.data.protocol import FractionSplit, SplitFolders, ValSize
from vit.features import weights_key
from vit.files import cache_dir
from vit.probe import C_GRID, K_GRID, fit_probes, folded_head, probe_state_dict, split_features

SPLITS = ("train", "val", "test")
CHECKPOINT_NAME = "linear_probe.ckpt"


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The probe's own options, and the rest: `vit fit`'s model and data arguments."""
    parser = argparse.ArgumentParser(
        prog="vit probe", allow_abbrev=False,
        usage="vit probe --config CFG [--model.* ...] [--data.* ...] [--out CKPT] [--C C ...] [--k K ...] "
        "[--cache_dir DIR] [--no_cache] [--device DEV] [--batch_size N] [--num_workers N]",
        description="Linear-probe and kNN baseline on frozen ViT features, before fine-tuning. Prints the "
        "val and test top-1 of a logistic regression and a cosine kNN (C and k chosen on val; no test figure "
        "when the data has no test split apart from val), and saves the linear head as a checkpoint for "
        "`vit predict --ckpt` and `vit attention --ckpt`.",
        epilog="Model and data: any other argument is `vit fit`'s, e.g. --config configs/digits.yaml, "
        "--model.init_args.pretrained NAME_OR_FILE, --data vit.data.ImageFolder --data.root DIR "
        "(see `vit fit --help`). The trainer's settings are ignored: the probe trains nothing by gradient.",
    )
    parser.add_argument("--out", type=Path, default=None,
                        help="where to save the backbone with the logistic regression as its head (default: "
                        f"{CHECKPOINT_NAME} in a new run folder next to `vit fit`'s: the config's logger "
                        "save_dir/name/probe/version_N, e.g. logs/digits/probe/version_0)")
    parser.add_argument("--C", type=float, nargs="+", default=list(C_GRID), dest="C",
                        help="inverse L2 strengths to try; the best on val is kept (default: %(default)s)")
    parser.add_argument("--k", type=int, nargs="+", default=list(K_GRID),
                        help="neighbour counts to try; the best on val is kept, one value fixes it "
                        "(default: %(default)s)")
    parser.add_argument("--cache_dir", type=Path, default=cache_dir("features"),
                        help="where features are cached, keyed by weights and data (default: %(default)s)")
    parser.add_argument("--no_cache", action="store_true", help="extract features again and cache nothing")
    parser.add_argument("--device", default="auto",
                        help="auto (cuda when available), cpu, cuda:1, ... (default: %(default)s)")
    parser.add_argument("--batch_size", type=int, default=256,
                        help="images per batch while extracting (default: %(default)s)")
    parser.add_argument("--num_workers", type=int, default=None,
                        help="DataLoader workers while extracting (default: the datamodule's)")
    args, rest = parser.parse_known_args(list(argv))
    if not rest:
        parser.error("no model or data given: pass a config (--config configs/digits.yaml) or --model/--data")
    if min(args.C) <= 0 or min(args.k) < 1 or args.batch_size < 1:
        parser.error(f"--C must be positive, --k and --batch_size at least 1; "
                     f"got {args.C}, {args.k}, {args.batch_size}")
    return args, rest


def test_split_hint(data: Any) -> str:
    """How to give this datamodule a held-out test split."""
    if isinstance(data, SplitFolders) and data.split_folders:
        return f"add a test/ folder next to {data.root}/train and val"
    if isinstance(data, FractionSplit):
        return "set --data.test_fraction (e.g. 0.1)"
    if isinstance(data, ValSize):
        return "set --data.val_size (e.g. 5000) to hold val out of the training images"
    return "give the datamodule a test split apart from val"


def main(argv: Sequence[str]) -> dict[str, Any]:
    """Run `vit probe` with the given arguments (without the command name); returns the figures printed.

    ``*_test_acc`` are None, and ``held_out_test`` False, when the data has no test split apart from val."""
    from vit.data.base import no_test_reason

    args, rest = parse_args(argv)
    from vit.cli.main import build_model_and_data

    module, data, experiment = build_model_and_data(rest, "vit probe")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    model = module.eval_model.to(device).eval()
    data.prepare_data()
    data.setup("fit")
    num_workers = data.num_workers if args.num_workers is None else args.num_workers
    started, weights, found = time.perf_counter(), weights_key(model, module.model_config), {}
    no_test = no_test_reason(data)
    for split in SPLITS:
        if split == "test" and no_test:
            print(f"test: none held out ({no_test}), so no test figure: C and k are chosen on val, and the val "
                  f"figures, on the images that chose them, are optimistic. For a test figure, {test_split_hint(data)}")
            continue
        *found[split], how = split_features(
            model, data.eval_split(split), split, weights=weights, cache_dir=None if args.no_cache else args.cache_dir,
            batch_size=args.batch_size, num_workers=num_workers, device=device)
        print(f"{split}: {len(found[split][1])} images, {found[split][0].shape[1]} features: {how}")
    print(f"features ready in {time.perf_counter() - started:.1f} s")

    # Selection sees train and val only; the test split, if any, is scored once, by what val chose.
    probes = fit_probes(found["train"], found["val"], found.get("test"), c_grid=args.C, k_grid=args.k)
    chosen = lambda grid: f"chosen on val from {', '.join(map(str, sorted(set(grid))))}" if len(set(grid)) > 1 \
        else "fixed"
    scored = lambda val_acc, test_acc: f"val top-1 {val_acc:.4f}, " + (
        "no test figure (no held-out test split)" if test_acc is None else f"test top-1 {test_acc:.4f}")
    print(f"logistic regression (C={probes.C:g}, {chosen(args.C)}): "
          f"{scored(probes.logistic_val_acc, probes.logistic_test_acc)}")
    print(f"cosine kNN (k={probes.k}, {chosen(probes.ks)}): {scored(probes.knn_val_acc, probes.knn_test_acc)}")

    results = probes.results()
    head = folded_head(probes.scaler, probes.logistic, module.hparams.num_classes)
    path = args.out or new_run_folder(experiment / "probe") / CHECKPOINT_NAME
    weights = probe_state_dict(module.eval_model.state_dict(), head)
    out = save_checkpoint(classifier_checkpoint(module.checkpoint_meta(), weights, probe=results), path)
    print(f"saved the backbone with the logistic-regression head to {out} (vit predict --ckpt {out} IMAGES)")
    return {**results, "checkpoint": str(out)}
