"""`vit calibrate --ckpt CKPT --config CFG`: calibrated probabilities and an "unknown" answer for a checkpoint.

    vit calibrate --ckpt logs/digits/checkpoints/best-epoch=41-step=840.ckpt --config configs/digits.yaml
    vit calibrate --ckpt model.ckpt --config configs/scratch_small.yaml --data.init_args.root photos/ --acceptance 0.99
    vit calibrate --ckpt logs/digits/checkpoints/last.ckpt --config logs/digits/version_0/config.yaml   the run's own

Fits one temperature on the validation split (the NLL, LBFGS), the unknown score (class means and precisions
of the training split's features, every layer) and its threshold (``--acceptance`` of val accepted), prints
ECE, NLL and Brier before and after, and writes them into the checkpoint (or ``--out``); ``--calibrate
temperature``: T alone. `vit fit` fits T at its end by default (``--calibrate unknown``: both); this is for a
checkpoint saved before, or other settings. The data may be the run's own config.yaml. `vit.deploy.calibration`
does the work. A multi-label checkpoint gets a temperature per class alone, its thresholds moved so that no label
changes (`vit.deploy.label_calibration`, docs/multilabel.md); the unknown options do not apply to it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vit.deploy.confidence import DEFAULT_LABEL


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The command's own options, and the rest: `vit fit`'s data arguments (--config ...)."""
    parser = argparse.ArgumentParser(
        prog="vit calibrate", allow_abbrev=False,
        usage="vit calibrate --ckpt CKPT --config CFG [--data.* ...] [--calibrate unknown|temperature] "
        "[--acceptance 0.95 | --outliers DIR] [--out CKPT]",
        description="Fit a temperature and an 'unknown' threshold for a `vit fit` checkpoint on its data's "
        "validation split, and store them in the checkpoint.",
        epilog="The data: the config (and --data.* flags) the checkpoint was trained with.")
    parser.add_argument("--ckpt", type=Path, required=True, help="a `vit fit` checkpoint of an image classifier")
    parser.add_argument("--calibrate", choices=("unknown", "temperature"), default="unknown",
                        help="unknown: T and the unknown score with its threshold; temperature: T alone, what `vit "
                        "fit` stores by default (no answer changes) (default: %(default)s)")
    parser.add_argument("--acceptance", type=float, default=0.95,
                        help="share of validation images the threshold accepts (default: %(default)s)")
    parser.add_argument("--outliers", type=Path, default=None, metavar="FOLDER",
                        help="images of none of the classes (backgrounds, other products): the threshold is set "
                        "to tell val from them best, instead of by --acceptance")
    parser.add_argument("--layers", choices=("all", "pooled"), default="all",
                        help="the features the unknown score reads: every block's and the pooled ones (measured "
                        "best), or the pooled ones alone (a smaller checkpoint) (default: %(default)s)")
    parser.add_argument("--covariance", choices=("auto", "class", "shared"), default="auto",
                        help="the unknown score's covariance: one per class (measured best), one shared by the "
                        "classes (C times smaller), or auto: per class where that adds at most 32 MiB "
                        "(default: %(default)s)")
    parser.add_argument("--label", default=DEFAULT_LABEL, help="the answer for an unknown image (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="write a calibrated copy here (default: in place)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, ... (default: %(default)s)")
    args, rest = parser.parse_known_args(list(argv))
    if not rest:
        parser.error("no data given: pass the checkpoint's config (--config configs/digits.yaml)")
    if not 0 < args.acceptance <= 1:
        parser.error(f"--acceptance must be in (0, 1], got {args.acceptance}")
    return args, rest


def main(argv: Sequence[str]) -> dict[str, Any]:
    """Run `vit calibrate` (arguments without the command name); returns the stored calibration and report."""
    args, rest = parse_args(argv)
    if not args.ckpt.is_file():
        from vit.errors import UserPathError

        raise UserPathError(f"--ckpt: no such checkpoint file: {args.ckpt}")
    from vit.cli.main import build_model_and_data
    from vit.deploy.calibration import calibrate_checkpoint

    _, data, _ = build_model_and_data(rest, "vit calibrate")
    data.prepare_data()
    data.setup("fit")
    confidence = calibrate_checkpoint(args.ckpt, data, acceptance=args.acceptance, label=args.label,
                                      out=args.out, device=args.device, outliers=args.outliers,
                                      layers=args.layers, covariance=args.covariance,
                                      unknown=args.calibrate == "unknown")
    return {**confidence.calibration.to_dict(), "report": confidence.report}
