"""`vit select`: which images of a folder to label next, as a labels file to fill in and a PNG grid to look at.

    vit select --from photos/ --budget 200 --out to_label.csv --model vit_small_patch16_224 \\
        --pretrained logs/mae_folder_vit_small/checkpoints/last.ckpt --global_pool avg   # a cold start: no labels
    vit select --from photos/ --budget 100 --out round2.csv --ckpt logs/.../best.ckpt --labelled labels.csv

With no classifier (``--model`` and its ``--pretrained`` weights, e.g. a `vit pretrain` MAE checkpoint) the choice
is typical and diverse (`vit.active.choose.typical_diverse`); with a `vit fit` checkpoint and ``--labelled`` it is
uncertain (margin of calibrated probabilities) and diverse (`uncertain_diverse`). Near-duplicates that `vit audit`
finds are chosen at most once. Fill in the label column and train: ``vit fit --data vit.data.LabelsFile
--data.root to_label.csv``. The choice is `vit.active`'s; this command parses, calls and prints.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vit.errors import UserValueError


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="vit select", allow_abbrev=False,
        description="Choose which images of a folder to label next: typical and diverse ones at a cold start, "
        "uncertain and diverse ones once a classifier is trained. Writes a labels file to fill in and a PNG grid.")
    parser.add_argument("--from", dest="pool", required=True, help="the folder of unlabelled images")
    parser.add_argument("--budget", type=int, required=True, help="how many images to choose")
    parser.add_argument("--out", type=Path, required=True, help="the labels file to write (CSV); the grid goes "
                        "beside it as .png")
    parser.add_argument("--ckpt", help="a `vit fit` checkpoint: its features, and its calibrated probabilities "
                        "with --labelled")
    parser.add_argument("--model", help="a model name (vit_small_patch16_224, vit_digits_patch4_16, ...) whose "
                        "features choose; with --pretrained for its weights")
    parser.add_argument("--pretrained", help="weights for --model: a `vit pretrain` checkpoint, a timm tag, a file")
    parser.add_argument("--global_pool", help="pooling of --model's features, e.g. avg (the patch tokens' mean: "
                        "for an MAE encoder, whose cls token is untrained); default: the model's")
    parser.add_argument("--labelled", help="the labels file of the images labelled so far (a later round)")
    parser.add_argument("--no_duplicates_check", action="store_true", help="skip the near-duplicate search")
    parser.add_argument("--seed", type=int, default=0, help="k-means seed (default: %(default)s)")
    parser.add_argument("--num_workers", type=int, default=0, help="DataLoader workers (default: %(default)s)")
    args = parser.parse_args(list(argv))
    if (args.ckpt is None) == (args.model is None):
        parser.error("give either --ckpt CKPT or --model NAME [--pretrained WEIGHTS] for the features")
    if args.budget < 1:
        parser.error(f"--budget must be at least 1, got {args.budget}")
    return args


def main(argv: Sequence[str]) -> dict[str, Any]:
    """Run `vit select`; returns what it wrote and the chosen files with their reasons."""
    from vit.active.choose import typical_diverse, uncertain_diverse
    from vit.active.pool import (
        duplicate_followers,
        feature_model,
        labelled_mask,
        pool_features,
        pool_files,
        write_grid,
        write_labels_file,
    )

    args = parse_args(argv)
    files = pool_files(args.pool)
    labelled = labelled_mask(args.labelled, files) if args.labelled else np.zeros(len(files), bool)
    if args.budget > (left := int((~labelled).sum())):
        raise UserValueError(f"--budget {args.budget} is more than the {left} unlabelled images in {args.pool}")
    model = feature_model(args.ckpt, args.model, args.pretrained, args.global_pool)
    features, probabilities, readable = pool_features(model, files, num_workers=args.num_workers)
    files = [files[i] for i in readable]
    labelled = labelled[readable]
    excluded = np.zeros(len(files), bool) if args.no_duplicates_check else duplicate_followers(files)
    if args.ckpt and args.labelled:
        picks = uncertain_diverse(features, probabilities, args.budget, labelled=labelled, excluded=excluded,
                                  class_names=model.class_names, seed=args.seed)
    else:
        picks = typical_diverse(features, args.budget, labelled=labelled, excluded=excluded, seed=args.seed)
    out = write_labels_file(args.out, files, picks)
    grid = write_grid(out.with_suffix(".png"), files, picks)
    skipped = f", {int(excluded.sum())} near-duplicates left out" if excluded.any() else ""
    print(f"chose {len(picks)} of {len(files)} images{skipped}: {out} (fill in its label column, then "
          f"vit fit --data vit.data.LabelsFile --data.root {out}); the images: {grid}")
    return {"labels_file": str(out), "grid": str(grid), "excluded": int(excluded.sum()),
            "chosen": [(str(files[p.index]), p.reason) for p in picks]}
