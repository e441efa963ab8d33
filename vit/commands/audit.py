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
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vit.audit.duplicates import DEFAULT_RADIUS, find_duplicates
from vit.audit.inventory import describe_pairs, inventory, label_conflicts, leakage
from vit.audit.report import (
    DUPLICATE_COLUMNS,
    LABEL_COLUMNS,
    render_html,
    summary_sentences,
    thumbnail_png,
    write_csv,
    write_json,
)
from vit.audit.scan import EditedThumbnails, ImageRecord, cached_scan_split
from vit.audit.verify import MIN_SCORE
from vit.checkpoints.runs import new_run_folder
from vit.errors import UserPathError, WeightsUnavailableError
from vit.features import blas_threads, cached_features
from vit.files import cache_dir, save_atomic

FAIL_ON = ("leakage", "bad_files", "duplicates", "label_conflicts", "label_issues", "small_classes")


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


def audited_splits(data: Any) -> list[str]:
    """train and val, and test when it is held out (not val under another name)."""
    from vit.data.base import no_test_reason

    return ["train", "val"] + ([] if no_test_reason(data) else ["test"])


def scan(data: Any, num_workers: int | None, cache_dir: Path | None
         ) -> tuple[list[ImageRecord], dict[str, Any], dict[str, str]]:
    """Every split's records, the splits' evaluation datasets, and where each split's records came from."""
    records, datasets, how = [], {}, {}
    for split in audited_splits(data):
        dataset = datasets[split] = data.eval_split(split)
        labels = [int(y) for y in dataset.labels]
        on_disk = len(dataset) > 0 and os.path.isfile(dataset.item_name(0))  # in-memory images: not worth a process
        workers = (len(os.sched_getaffinity(0)) if num_workers is None else num_workers) if on_disk else 1
        found, how[split] = cached_scan_split(dataset, split, labels, workers, cache_dir=cache_dir)
        records += found
    return records, datasets, how


def label_issues(module: Any, dataset: Any, records: list[ImageRecord], args: argparse.Namespace,
                 class_names: Sequence[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Confident learning on the training images that read: the summary entry and the CSV rows."""
    from threadpoolctl import threadpool_limits

    from vit.audit.labels import confident_learning, out_of_fold_probabilities, trust

    readable = [r for r in records if r.problem is None]
    counts = np.bincount([r.label for r in readable], minlength=len(class_names))
    # A class needs two images to be in a training fold and a held-out one; smaller ones sit this check out.
    good = [r for r in readable if counts[r.label] >= 2]
    left_out = [class_names[c] for c in range(len(class_names)) if 0 < counts[c] < 2]
    if len({r.label for r in good}) < 2:
        return {"flagged": None, "skipped": "needs two or more classes with two or more training images"}, []
    if len(good) < len(records):  # bad files would stop the loader: leave them out (this subset is not cached)
        dataset = torch.utils.data.Subset(dataset, [r.index for r in good])
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    model = module.eval_model.to(device).eval()
    features, labels, how = cached_features(
        model, module.model_config, dataset, "train", cache_dir=None if args.no_cache else args.cache_dir,
        batch_size=args.batch_size, device=device)
    x, y = features.numpy().astype(np.float64), labels.numpy()
    with threadpool_limits(blas_threads(*x.shape), user_api="blas"):
        probabilities = out_of_fold_probabilities(x, y, len(class_names), folds=args.folds, C=args.C)
    found = confident_learning(probabilities, y)
    trusted = trust(probabilities, y)
    rows = [] if not trusted["trusted"] else [{"path": good[i].name, "split": "train", "given": class_names[y[i]],
             "suggested": class_names[found.suggested[i]], "score": round(float(found.self_confidence[i]), 6),
             "_record": good[i]} for i in found.ranked_flagged()]
    source = module.hparams.pretrained or "random initialisation (no pretrained weights: expect noise)"
    backbone = f"{module.model_name} ({source})"
    note = (f"Out-of-fold probabilities of a {args.folds}-fold logistic regression on the pooled features of "
            f"{backbone}: {trusted['verdict'].split(':')[0]}; score is the given label's probability, lowest "
            "first. The quality of this list depends on the backbone: features that do not separate the classes "
            "flag hard images, not wrong labels."
            + (f" Left out: classes with a single training image ({', '.join(left_out)})." if left_out else ""))
    summary = {"flagged": len(rows) if trusted["trusted"] else None, **trusted,
               "flagged_if_trusted": int(found.flagged.sum()),
               "backbone": backbone, "folds": args.folds, "C": args.C, "features": how,
               "thresholds": {name: round(float(t), 4) for name, t in zip(class_names, found.thresholds)
                              if np.isfinite(t)}, "note": note}
    return summary, rows


def charts(inv: dict[str, Any], aspect: list[float]) -> dict[str, bytes]:
    """The inventory's PNG charts."""
    from vit.reports import bar_chart, histogram, png_bytes

    small = {s["class"] for s in inv["small_classes"]}
    drawn = {"classes": png_bytes(bar_chart(
        [], inv["classes"], title="images per class (red: under 10% of the largest class)", ylabel="images",
        series=inv["images_per_class"], highlight=[c in small for c in inv["classes"]]))}
    if aspect:
        drawn["aspect"] = png_bytes(histogram(aspect, title="aspect ratios", xlabel="width / height"))
    return drawn


def main(argv: Sequence[str]) -> dict[str, Any]:
    """Run `vit audit` with the given arguments (without the command name); returns summary.json's content.

    Raises SystemExit(1) after writing everything when a finding named in ``--fail_on`` is there."""
    from vit.cli.main import build_model_and_data
    from vit.data.folder import ImageFolder

    args, rest = parse_args(argv)
    started = time.perf_counter()
    no_weights = None
    try:
        module, data, experiment = build_model_and_data(
            [*rest, "--model.init_args.pretrained", "null"] if args.no_labels else rest, "vit audit")
    except (WeightsUnavailableError, UserPathError) as e:
        # The inventory, bad files and duplicates need no model: run them, and say why labels were not checked.
        no_weights = f"the pretrained weights could not be loaded ({str(e).splitlines()[0]})"
        module, data, experiment = build_model_and_data([*rest, "--model.init_args.pretrained", "null"], "vit audit")
    if isinstance(data, ImageFolder):
        data.check_images = False  # bad files are a finding here, not a reason to stop
    data.prepare_data()
    data.setup("fit")
    class_names = list(data.class_names)
    records, datasets, scanned_how = scan(data, args.num_workers, None if args.no_cache else args.cache_dir)
    scanned = time.perf_counter()

    inv = inventory(records, class_names)
    aspect = inv.pop("aspect_ratios")
    inv["aspect_ratio_range"] = [min(aspect), float(np.median(aspect)), max(aspect)] if aspect else []
    good = [r for r in records if r.problem is None]
    thumbs = np.stack([r.thumb for r in good]) if good else np.zeros((0, 3, 32, 32), np.uint8)
    found, candidates = find_duplicates([r.content for r in good], [r.phash for r in good], [r.windows for r in good],
                                        [r.luma for r in good], thumbs, EditedThumbnails(good, datasets),
                                        args.radius, args.min_score)
    pairs = describe_pairs(good, found, class_names)
    cross = sum(p["split_a"] != p["split_b"] for p in pairs)
    exact = sum(p["kind"] == "exact" for p in pairs)
    cross_exact = sum(p["split_a"] != p["split_b"] and p["kind"] == "exact" for p in pairs)
    summary: dict[str, Any] = {
        "data": str(getattr(data, "root", type(data).__name__)), "inventory": inv,
        "duplicates": {"exact": exact, "near": len(pairs) - exact, "cross_split": cross,
                       "cross_split_exact": cross_exact, "cross_split_near": cross - cross_exact,
                       "within_split": len(pairs) - cross, "radius": args.radius, "candidates": candidates,
                       "rejected": candidates - (len(pairs) - exact), "min_score": args.min_score},
        "leakage": leakage(pairs), "label_conflicts": len(label_conflicts(pairs)), "label_issues": None,
        "scan": scanned_how,
    }
    issues: list[dict[str, Any]] = []
    if no_weights:
        summary["label_issues"] = {"flagged": None, "skipped": f"{no_weights}; pass weights that load "
                                   "(--model.init_args.pretrained FILE), or --no_labels to skip it on purpose"}
    elif not args.no_labels:
        train_records = [r for r in records if r.split == "train"]
        summary["label_issues"], issues = label_issues(module, datasets["train"], train_records, args, class_names)
    summary["seconds"] = {"scan": round(scanned - started, 2), "total": round(time.perf_counter() - started, 2)}

    out = args.out or new_run_folder(experiment / "audit")
    thumb = lambda record: thumbnail_png(datasets[record.split].raw_image(record.index))
    page = render_html(summary, charts(inv, aspect), pairs, issues, thumb, shown=args.shown)
    write_json(out / "summary.json", summary)
    write_csv(out / "duplicates.csv", DUPLICATE_COLUMNS, pairs)
    write_csv(out / "label_issues.csv", LABEL_COLUMNS, issues)
    save_atomic(lambda f: f.write(page.encode()), out / "report.html")

    print(f"audit of {summary['data']}: {inv['images']} images, {len(class_names)} classes "
          f"({', '.join(f'{n} {s}' for s, n in inv['images_per_split'].items())})")
    cached = [split for split, how in scanned_how.items() if how.startswith("loaded from cache")]
    if cached:
        print(f"  the scan of {', '.join(cached)} came from the cache in {args.cache_dir}, as the images have "
              "not changed since (--no_cache scans again)")
    uncached = sorted({how.split("not cached", 1)[1].strip(" :()") for how in scanned_how.values()
                       if "not cached" in how})
    for why in uncached:  # the next audit will scan again: say why, once
        print(f"  the scan was not cached: {why}")
    for sentence in summary_sentences(summary):
        print(f"  {sentence}")
    print(f"wrote {out}/report.html, summary.json, duplicates.csv and label_issues.csv "
          f"in {summary['seconds']['total']:.1f} s")
    found = {"leakage": bool(summary["leakage"]), "bad_files": bool(inv["bad_files"]), "duplicates": bool(pairs),
             "label_conflicts": bool(summary["label_conflicts"]), "small_classes": bool(inv["small_classes"]),
             # never on a list the report itself calls untrustworthy (or a check that was skipped)
             "label_issues": bool((summary["label_issues"] or {}).get("trusted")
                                  and (summary["label_issues"] or {}).get("flagged"))}
    failed = [what for what in args.fail_on if found[what]]
    if failed:
        print(f"vit audit: found {', '.join(failed)} (--fail_on): exit status 1")
        raise SystemExit(1)
    return {**summary, "out": str(out)}
