"""`vit attention --faithfulness --ckpt model.ckpt photos/`: do the checkpoint's attention maps mean anything?

On the given images (prepared as `vit predict` prepares them) it prints and writes, to
``<out>/faithfulness.json``:
* deletion and insertion AUCs (MoRF, LeRF, insertion) for the cls map, rollout and gradient rollout,
  against a random patch order (`vit.explain.checks.perturbation_curves`);
* the cascading model-randomisation check: each map's Spearman correlation with the trained model's as the
  head and then the blocks from the top down are re-initialised (Adebayo et al., 2018).
`vit attention` hands over here when it sees ``--faithfulness``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from vit.errors import UserValueError


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options of `vit attention --faithfulness`."""
    parser = argparse.ArgumentParser(prog="vit attention --faithfulness", description=__doc__.splitlines()[0])
    parser.add_argument("--faithfulness", action="store_true", help="run the checks (this command)")
    parser.add_argument("images", nargs="+", type=Path, help="image files, or folders searched recursively")
    parser.add_argument("--ckpt", required=True, type=Path, help="checkpoint written by `vit fit`")
    parser.add_argument("--max_images", type=int, default=256, help="check at most this many images (default: 256)")
    parser.add_argument("--out", type=Path, default=Path("attention_maps"), help="output folder (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    args = parser.parse_args(list(argv))
    if args.max_images < 1:
        parser.error(f"--max_images must be at least 1, got {args.max_images}")
    return args


def main(argv: Sequence[str]) -> dict:
    """Run `vit attention --faithfulness ...` (without the command name); returns the numbers."""
    args = parse_args(argv)
    from vit.data.io import find_images, load_image
    from vit.deploy.classifier import read_classifier
    from vit.explain.checks import MAPS, cascading_randomisation, faithfulness_table

    files = find_images(args.images).files[: args.max_images]
    classifier = read_classifier(args.ckpt, args.device)
    classifier.require_vit("the faithfulness checks of attention maps", args.ckpt)
    transform, mode = classifier.eval_transform(), "L" if classifier.in_chans == 1 else "RGB"
    tensors, unreadable = [], []
    for path in files:
        try:
            tensors.append(transform(load_image(path, mode)))  # as `vit predict` decodes it
        except OSError as error:
            unreadable.append(f"{path}: {error}")
    if not tensors:
        raise UserValueError(f"no readable image among {[str(p) for p in args.images]}: {unreadable[:3]}")
    images = torch.stack(tensors).to(args.device)
    model = classifier.model.eval()
    table = faithfulness_table(model, images)
    randomised = cascading_randomisation(model, images)
    result = {"images": len(tensors), "unreadable": unreadable, "deletion_insertion_auc": table,
              "randomisation_spearman": randomised}
    print(f"{len(tensors)} images ({len(unreadable)} unreadable)")
    print("map            MoRF del. (low)  LeRF del. (high)  insertion (high)")
    for name, aucs in table.items():
        print(f"{name:<14} {aucs['MoRF deletion']:>15.3f} {aucs['LeRF deletion']:>17.3f} {aucs['insertion']:>17.3f}")
    first = next(iter(table.values()))
    print(f"{'random order':<14} {first['random deletion']:>15.3f} {first['random deletion']:>17.3f} "
          f"{first['random insertion']:>17.3f}")
    print("randomised                 " + "  ".join(f"{name:>13}" for name in MAPS))
    for i, step in enumerate(randomised["steps"]):
        print(f"{step:<26} " + "  ".join(f"{randomised[name][i]:>13.3f}" for name in MAPS))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "faithfulness.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out / 'faithfulness.json'}")
    return result
