"""`vit audit`: what is wrong with a dataset, found before it costs a training run.

    vit audit --config configs/digits.yaml --out audit/
    vit audit --config configs/finetune/folder_cpu.yaml --data.init_args.root photos/ --fail_on leakage,bad_files

Model and data come from the same config and flags as `vit fit` and `vit probe`. Every image of every split
is read once (`vit.audit.scan`): the inventory (images per class and split, sizes, aspect ratios, modes,
formats, bad files), exact duplicates (the same decoded pixels) and near-duplicates (pHash candidates within
``--radius`` bits and luminance-SimHash candidates, through multi-index hash tables, each verified on the
pixels: `vit.audit.verify`), across splits (leakage) and classes (label conflicts). Label issues come from
confident learning on out-of-fold probabilities of a k-fold logistic regression on the backbone's pooled
features of the training images (cached like `vit probe`'s), with that classifier's accuracy beside chance; a
list from a classifier too close to chance is reported as untrustworthy, not as wrong labels. Weights that
cannot be loaded (no network, a missing file) skip the label check, and say why; the other checks need no
model. Writes summary.json, duplicates.csv, label_issues.csv and a self-contained report.html to ``--out``
(default: a run folder beside `vit fit`'s, ``<logger save_dir>/<name>/audit/version_N``). The scan of each
split is cached, keyed by the data's fingerprint (every file's path, size and modification time) and the code that
made it, so a second audit of unchanged data (another ``--radius``, ``--fail_on``, a label check) skips it. The
exit status is 0, or 1 when something named in ``--fail_on`` is found.
The audit itself is `vit.audit.run`'s; this command builds the model and data, calls it and prints.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vit.audit.duplicates import DEFAULT_RADIUS
from vit.audit.report import summary_sentences
from vit.audit.run import FAIL_ON, AuditOptions, findings, run_audit
from vit.audit.verify import MIN_SCORE
from vit.checkpoints.runs import new_run_folder
from vit.errors import UserPathError, WeightsUnavailableError
from vit.files import cache_dir


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The audit's own options, and the rest: `vit fit`'s model and data arguments."""
    parser = argparse.ArgumentParser(
        prog="vit audit", allow_abbrev=False,
        usage="vit audit --config CFG [--model.* ...] [--data.* ...] [--out DIR] [--fail_on WHAT,...] [--radius R] "
        "[--min_score S] "
        "[--folds K] [--no_labels] [--cache_dir DIR] [--no_cache] [--device DEV] [--batch_size N] [--num_workers N]",
        description="Check a dataset before training: images per class and split, sizes, modes and formats, bad "
        "files, exact and near-duplicates (across splits: leakage), and label issues by confident learning on the "
        "backbone's features. Writes report.html, summary.json, duplicates.csv and label_issues.csv.",
        epilog="Model and data: any other argument is `vit fit`'s, e.g. --config configs/digits.yaml, "
        "--data vit.data.ImageFolder --data.root DIR, --model.init_args.pretrained NAME_OR_FILE (the label check "
        "is only as good as these features). The trainer's settings are ignored.",
    )
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: a new run folder beside `vit fit`'s: the config's logger "
                        "save_dir/name/audit/version_N)")
    parser.add_argument("--fail_on", default="",
                        help=f"exit with status 1 when any of these is found (comma-separated): {', '.join(FAIL_ON)}")
    parser.add_argument("--radius", type=int, default=DEFAULT_RADIUS,
                        help="near-duplicate candidates: at most this many of the 64 pHash bits differ, between one "
                        "image and the other or a zoomed window of it (default: %(default)s); a second hash, of "
                        "the 8x8 luminance, proposes the textures pHash misses")
    parser.add_argument("--min_score", type=float, default=MIN_SCORE,
                        help="near-duplicates: no candidate whose aligned colour correlation is below this is a "
                        "copy, whatever its images' own bars (default: %(default)s; docs/audit.md)")
    parser.add_argument("--folds", type=int, default=5, help="label issues: cross-validation folds (default: 5)")
    parser.add_argument("--C", type=float, default=1.0, dest="C",
                        help="label issues: inverse L2 strength of the logistic regression (default: %(default)s)")
    parser.add_argument("--no_labels", action="store_true", help="skip the label check (no features extracted)")
    parser.add_argument("--shown", type=int, default=60, help="pairs and label issues drawn in report.html")
    parser.add_argument("--cache_dir", type=Path, default=cache_dir("features"),
                        help="where the scan of each split (keyed by the data and the code) and the features "
                        "(keyed by weights and data) are cached, so that a second audit of unchanged data reads "
                        "no image twice (default: %(default)s)")
    parser.add_argument("--no_cache", action="store_true", help="scan and extract features again, cache nothing")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda:1, ...")
    parser.add_argument("--batch_size", type=int, default=256, help="images per batch while extracting features")
    parser.add_argument("--num_workers", type=int, default=None,
                        help="processes that read images (default: every core this process may use)")
    args, rest = parser.parse_known_args(list(argv))
    if not rest:
        parser.error("no model or data given: pass a config (--config configs/digits.yaml) or --model/--data")
    args.fail_on = [w.strip() for w in args.fail_on.split(",") if w.strip()]
    unknown = sorted(set(args.fail_on) - set(FAIL_ON))
    if unknown:
        parser.error(f"--fail_on: unknown {', '.join(unknown)}; choose from {', '.join(FAIL_ON)}")
    if not 0 <= args.radius <= 32 or args.folds < 2 or args.C <= 0 or args.batch_size < 1 \
            or not -1 <= args.min_score <= 1:
        parser.error(f"--radius must be in 0..32, --folds at least 2, --C positive, --batch_size at least 1 and "
                     f"--min_score in -1..1; got {args.radius}, {args.folds}, {args.C}, {args.batch_size}, "
                     f"{args.min_score}")
    return args, rest


def main(argv: Sequence[str]) -> dict[str, Any]:
    """Run `vit audit` with the given arguments (without the command name); returns summary.json's content.

    Raises SystemExit(1) after writing everything when a finding named in ``--fail_on`` is there."""
    from vit.cli.main import build_model_and_data

    args, rest = parse_args(argv)
    started = time.perf_counter()
    skipped = None
    try:
        module, data, experiment = build_model_and_data(
            [*rest, "--model.init_args.pretrained", "null"] if args.no_labels else rest, "vit audit")
    except (WeightsUnavailableError, UserPathError) as e:
        # The inventory, bad files and duplicates need no model: run them, and say why labels were not checked.
        skipped = (f"the pretrained weights could not be loaded ({str(e).splitlines()[0]}); pass weights that load "
                   "(--model.init_args.pretrained FILE), or --no_labels to skip it on purpose")
        module, data, experiment = build_model_and_data([*rest, "--model.init_args.pretrained", "null"], "vit audit")
    options = AuditOptions(radius=args.radius, min_score=args.min_score, labels=not args.no_labels, folds=args.folds,
                           C=args.C, cache_dir=None if args.no_cache else args.cache_dir, device=args.device,
                           batch_size=args.batch_size, num_workers=args.num_workers)
    audit = run_audit(module, data, options, labels_skipped=skipped, started=started)
    out = audit.write(args.out or new_run_folder(experiment / "audit"), shown=args.shown)
    print_summary(audit.summary, args.cache_dir)
    print(f"wrote {out}/report.html, summary.json, duplicates.csv and label_issues.csv "
          f"in {audit.summary['seconds']['total']:.1f} s")
    failed = [what for what in args.fail_on if findings(audit.summary)[what]]
    if failed:
        print(f"vit audit: found {', '.join(failed)} (--fail_on): exit status 1")
        raise SystemExit(1)
    return {**audit.summary, "out": str(out)}


def print_summary(summary: dict[str, Any], cache: Path) -> None:
    """The audit in a few lines: the data, where the scan came from, and the findings, worst first."""
    inv = summary["inventory"]
    print(f"audit of {summary['data']}: {inv['images']} images, {len(inv['classes'])} classes "
          f"({', '.join(f'{n} {s}' for s, n in inv['images_per_split'].items())})")
    cached = [split for split, how in summary["scan"].items() if how.startswith("loaded from cache")]
    if cached:
        print(f"  the scan of {', '.join(cached)} came from the cache in {cache}, as the images have "
              "not changed since (--no_cache scans again)")
    uncached = sorted({how.split("not cached", 1)[1].strip(" :()") for how in summary["scan"].values()
                       if "not cached" in how})
    for why in uncached:  # the next audit will scan again: say why, once
        print(f"  the scan was not cached: {why}")
    for sentence in summary_sentences(summary):
        print(f"  {sentence}")
