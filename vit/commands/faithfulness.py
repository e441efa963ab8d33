"""`vit attention --faithfulness --ckpt model.ckpt photos/`: do the checkpoint's attention maps mean anything?

On the given images (prepared as `vit predict` prepares them) it prints and writes, to
``<out>/faithfulness.json``:
* deletion and insertion AUCs (MoRF, LeRF, insertion) for the cls map, rollout and gradient rollout,
  against a random patch order (`vit.explain.checks.perturbation_curves`);
* the cascading model-randomisation check: each map's Spearman correlation with the trained model's as the
  head and then the blocks from the top down are re-initialised (Adebayo et al., 2018).
`vit attention` parses the options (this module adds the group of its own) and runs `run` when ``--faithfulness``
is given.
"""

from __future__ import annotations

import argparse
import json

import torch

from vit.errors import UserValueError
from vit.files import save_atomic

OPTIONS = ("max_images",)  # the options of this mode alone (argparse dests)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options of `vit attention --faithfulness`, as a group of `vit attention`'s parser."""
    group = parser.add_argument_group("--faithfulness: the checks of the maps")
    group.add_argument("--max_images", type=int, default=256, help="check at most this many images (default: 256)")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what cannot run in `vit attention --faithfulness`."""
    if not args.images:
        parser.error("--faithfulness checks the maps on images: give image files or folders")
    if args.max_images < 1:
        parser.error(f"--max_images must be at least 1, got {args.max_images}")


def run(args: argparse.Namespace) -> dict:
    """Run `vit attention --faithfulness ...` on parsed (and checked) options; returns the numbers."""
    from vit.data.io import find_images, load_image
    from vit.deploy.classifier import read_classifier
    from vit.explain.checks import MAPS, cascading_randomisation, faithfulness_table

    files = find_images(args.images).files[: args.max_images]
    classifier = read_classifier(args.ckpt, args.device)
    classifier.require_vit("the faithfulness checks of attention maps", args.ckpt)
    transform = classifier.eval_transform()
    tensors, unreadable = [], []
    for path in files:
        try:
            tensors.append(transform(load_image(path, classifier.image_mode)))  # as `vit predict` decodes it
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
    path = save_atomic(lambda f: f.write(json.dumps(result, indent=2).encode()), args.out / "faithfulness.json")
    print(f"wrote {path}")
    return result
