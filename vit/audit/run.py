"""One audit of a dataset, as `vit audit` runs it: every split scanned, then duplicates, leakage and label issues
gathered into summary.json's content, and the four files written.

    audit = run_audit(module, data, AuditOptions(cache_dir=cache_dir("features")))
    audit.write(out)                       # summary.json, duplicates.csv, label_issues.csv, report.html
    failed = [what for what in ("leakage", "bad_files") if findings(audit.summary)[what]]

``data`` is a `vit fit` DataModule (any with ``eval_split``, ``class_names`` and set-up hooks) and ``module`` the
task whose backbone's pooled features feed the label check (an `ImageClassifier`; only its evaluated model, model
config and names are read). The checks themselves are the modules beside this one. Lightning comes in only
with the DataModule (`vit.data`), when an audit runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
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
    thumbnail_png,
    write_csv,
    write_json,
)
from vit.audit.scan import EditedThumbnails, ImageRecord, cached_scan_split
from vit.audit.verify import MIN_SCORE
from vit.data.protocol import TableRows
from vit.features import blas_threads, cached_features
from vit.files import save_atomic

FAIL_ON = ("leakage", "bad_files", "duplicates", "label_conflicts", "label_issues", "small_classes")


@dataclass
class AuditOptions:
    """The settings of one audit (`vit audit`'s options of the same names)."""

    radius: int = DEFAULT_RADIUS  # near-duplicate candidates: pHash bits that may differ
    min_score: float = MIN_SCORE  # near-duplicates: the least aligned colour correlation of a copy
    labels: bool = True  # run the label check (extracts features)
    folds: int = 5  # label check: cross-validation folds
    C: float = 1.0  # label check: inverse L2 strength of the logistic regression
    cache_dir: Path | None = None  # the scans' and features' cache; None caches nothing
    device: str = "auto"  # where features are extracted: auto (cuda when available), cpu, cuda:1, ...
    batch_size: int = 256  # images per batch while extracting features
    num_workers: int | None = None  # processes that read images (None: every core this process may use)


@dataclass
class Audit:
    """What one audit found: summary.json's content, the CSVs' rows, the charts, and the datasets it read."""

    summary: dict[str, Any]
    pairs: list[dict[str, Any]]  # duplicates.csv's rows (with the records, for thumbnails)
    issues: list[dict[str, Any]]  # label_issues.csv's rows (likewise)
    charts: dict[str, bytes]  # PNG charts of the inventory
    datasets: dict[str, Any]  # split -> the evaluation dataset that was scanned

    def thumbnail(self, record: ImageRecord) -> bytes:
        """A record's image as a PNG thumbnail for the report."""
        return thumbnail_png(self.datasets[record.split].raw_image(record.index))

    def write(self, out: str | os.PathLike, *, shown: int = 60) -> Path:
        """summary.json, duplicates.csv, label_issues.csv and report.html (``shown`` pairs and issues drawn),
        each written atomically into the folder ``out``; returns it."""
        out = Path(out)
        page = render_html(self.summary, self.charts, self.pairs, self.issues, self.thumbnail, shown=shown)
        write_json(out / "summary.json", self.summary)
        write_csv(out / "duplicates.csv", DUPLICATE_COLUMNS, self.pairs)
        write_csv(out / "label_issues.csv", LABEL_COLUMNS, self.issues)
        save_atomic(lambda f: f.write(page.encode()), out / "report.html")
        return out


def audited_splits(data: Any) -> list[str]:
    """train and val, and test when it is held out (not val under another name)."""
    from vit.data.base import no_test_reason

    return ["train", "val"] + ([] if no_test_reason(data) else ["test"])


def scan(data: Any, num_workers: int | None, cache_dir: Path | None, labels_of: dict[str, list[int]] | None = None,
         ) -> tuple[list[ImageRecord], dict[str, Any], dict[str, str]]:
    """Every split's records, the splits' evaluation datasets, and where each split's records came from; each item's
    label is its class, or its index in ``labels_of`` (multi-label data's label sets)."""
    records, datasets, how = [], {}, {}
    for split in audited_splits(data):
        dataset = datasets[split] = data.eval_split(split)
        labels = labels_of[split] if labels_of else [int(y) for y in dataset.labels]
        on_disk = len(dataset) > 0 and os.path.isfile(dataset.item_name(0))  # in-memory images: not worth a process
        workers = (len(os.sched_getaffinity(0)) if num_workers is None else num_workers) if on_disk else 1
        found, how[split] = cached_scan_split(dataset, split, labels, workers, cache_dir=cache_dir)
        records += found
    return records, datasets, how


def duplicates(records: Sequence[ImageRecord], datasets: dict[str, Any], class_names: Sequence[str],
               options: AuditOptions) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Exact and near-duplicate pairs among the readable images (duplicates.csv's rows), and their summary entry."""
    good = [r for r in records if r.problem is None]
    thumbs = np.stack([r.thumb for r in good]) if good else np.zeros((0, 3, 32, 32), np.uint8)
    found, candidates = find_duplicates([r.content for r in good], [r.phash for r in good], [r.windows for r in good],
                                        [r.luma for r in good], thumbs, EditedThumbnails(good, datasets),
                                        options.radius, options.min_score)
    pairs = describe_pairs(good, found, class_names)
    cross = sum(p["split_a"] != p["split_b"] for p in pairs)
    exact = sum(p["kind"] == "exact" for p in pairs)
    cross_exact = sum(p["split_a"] != p["split_b"] and p["kind"] == "exact" for p in pairs)
    return pairs, {"exact": exact, "near": len(pairs) - exact, "cross_split": cross,
                   "cross_split_exact": cross_exact, "cross_split_near": cross - cross_exact,
                   "within_split": len(pairs) - cross, "radius": options.radius, "candidates": candidates,
                   "rejected": candidates - (len(pairs) - exact), "min_score": options.min_score}


def label_issues(module: Any, dataset: Any, records: list[ImageRecord], class_names: Sequence[str],
                 options: AuditOptions) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Confident learning on the training images that read: the summary entry and the CSV rows."""
    from vit.audit.labels import confident_learning, trust

    readable = [r for r in records if r.problem is None]
    counts = np.bincount([r.label for r in readable], minlength=len(class_names))
    # A class needs two images to be in a training fold and a held-out one; smaller ones sit this check out.
    good = [r for r in readable if counts[r.label] >= 2]
    left_out = [class_names[c] for c in range(len(class_names)) if 0 < counts[c] < 2]
    if len({r.label for r in good}) < 2:
        return {"flagged": None, "skipped": "needs two or more classes with two or more training images"}, []
    if len(good) < len(records):  # bad files would stop the loader: leave them out (this subset is not cached)
        dataset = torch.utils.data.Subset(dataset, [r.index for r in good])
    probabilities, y, how = _out_of_fold(module, dataset, len(class_names), options)
    found = confident_learning(probabilities, y)
    trusted = trust(probabilities, y)
    rows = [] if not trusted["trusted"] else [{"path": good[i].name, "split": "train", "given": class_names[y[i]],
             "suggested": class_names[found.suggested[i]], "score": round(float(found.self_confidence[i]), 6),
             "_record": good[i]} for i in found.ranked_flagged()]
    source = module.hparams.pretrained or "random initialisation (no pretrained weights: expect noise)"
    backbone = f"{module.model_name} ({source})"
    note = (f"Out-of-fold probabilities of a {options.folds}-fold logistic regression on the pooled features of "
            f"{backbone}: {trusted['verdict'].split(':')[0]}; score is the given label's probability, lowest "
            "first. The quality of this list depends on the backbone: features that do not separate the classes "
            "flag hard images, not wrong labels."
            + (f" Left out: classes with a single training image ({', '.join(left_out)})." if left_out else ""))
    summary = {"flagged": len(rows) if trusted["trusted"] else None, **trusted,
               "flagged_if_trusted": int(found.flagged.sum()),
               "backbone": backbone, "folds": options.folds, "C": options.C, "features": how,
               "thresholds": {name: round(float(t), 4) for name, t in zip(class_names, found.thresholds)
                              if np.isfinite(t)}, "note": note}
    return summary, rows


def _out_of_fold(module: Any, dataset: Any, num_classes: int, options: AuditOptions
                 ) -> tuple[np.ndarray, np.ndarray, str]:
    """Out-of-fold class probabilities of the dataset's images from its pooled features, their labels, and where
    the features came from."""
    from threadpoolctl import threadpool_limits

    from vit.audit.labels import out_of_fold_probabilities

    device = options.device
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    model = module.eval_model.to(device).eval()
    features, labels, how = cached_features(model, module.model_config, dataset, "train",
                                            cache_dir=options.cache_dir, batch_size=options.batch_size, device=device)
    x, y = features.numpy().astype(np.float64), labels.numpy()
    with threadpool_limits(blas_threads(*x.shape), user_api="blas"):
        probabilities = out_of_fold_probabilities(x, y, num_classes, folds=options.folds, C=options.C)
    return probabilities, y, how


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


# ---- multi-label data: label sets, not classes ------------------------------------------------------------------
MULTI_LABEL_SKIP = ("not run: confident learning assumes one label per image, and this data is multi-label (several "
                    "per image); duplicates are compared by their whole label sets instead")


def label_sets(data: Any, class_names: Sequence[str]) -> tuple[dict[str, list[int]], list[str]]:
    """Each item's label set written out ("red;cotton", an unknown label as "?wool", none as "-") as an index into
    their sorted list, per split: what a pair of identical images must agree on."""
    written = {}
    for split in audited_splits(data):
        rows = data.eval_split(split).labels.tolist()  # (N, C): 1, 0, -1 unknown
        written[split] = [";".join([n for n, t in zip(class_names, row) if t > 0]
                                   + [f"?{n}" for n, t in zip(class_names, row) if t < 0]) or "-" for row in rows]
    names = sorted({w for ws in written.values() for w in ws})
    index = {name: i for i, name in enumerate(names)}
    return {split: [index[w] for w in ws] for split, ws in written.items()}, names


def positives(datasets: dict[str, Any], class_names: Sequence[str]) -> dict[str, Any]:
    """The inventory's per-class entries for multi-label data: images that have each label, per split."""
    from vit.audit.inventory import SMALL_CLASS

    counts = {split: (d.labels > 0).sum(0).tolist() for split, d in datasets.items()}
    base = counts.get("train", [])
    largest = max(base, default=0)
    return {"classes": list(class_names), "images_per_class": counts,
            "small_classes": [{"class": class_names[c], "images": n, "largest": largest}
                              for c, n in enumerate(base) if n < SMALL_CLASS * largest]}


def table_rows(data: Any, inv: dict[str, Any]) -> list[dict[str, Any]]:
    """A labels table's bad rows (`vit.data.LabelsFile`), left out for the audit: missing files join the bad
    files; all are listed by line."""
    bad = data.read().bad if isinstance(data, TableRows) else []
    inv["bad_files"] += [{"path": b.detail, "split": "table", "problem": f"missing (line {b.line} of the table)"}
                         for b in bad if b.kind == "missing file"]
    return [{"line": b.line, "kind": b.kind, "detail": b.detail} for b in bad]


def run_audit(module: Any, data: Any, options: AuditOptions, *, labels_skipped: str | None = None,
              started: float | None = None) -> Audit:
    """Audit ``data`` (set up here), the label check on ``module``'s features unless ``options.labels`` is False
    or ``labels_skipped`` says why it cannot run; ``started`` (a `time.perf_counter`) times the run from earlier."""
    from vit.data.folder import ImageFolder

    started = time.perf_counter() if started is None else started
    if isinstance(data, ImageFolder):
        data.check_images = False  # bad files are a finding here, not a reason to stop
    if isinstance(data, TableRows):
        data.skip_bad_rows = True  # and so are a labels table's bad rows
    data.prepare_data()
    data.setup("fit")
    class_names = list(data.class_names)
    multi = bool(getattr(data, "multi_label", False))
    labels_of, names = label_sets(data, class_names) if multi else (None, class_names)
    records, datasets, scanned_how = scan(data, options.num_workers, options.cache_dir, labels_of)
    scanned = time.perf_counter()

    inv = inventory(records, names)
    aspect = inv.pop("aspect_ratios")
    inv["aspect_ratio_range"] = [min(aspect), float(np.median(aspect)), max(aspect)] if aspect else []
    if multi:
        inv.update(positives(datasets, class_names))
        labels_skipped = labels_skipped or MULTI_LABEL_SKIP
    pairs, found = duplicates(records, datasets, names, options)
    summary: dict[str, Any] = {
        "data": str(getattr(data, "root", type(data).__name__)), "inventory": inv, "duplicates": found,
        "leakage": leakage(pairs), "label_conflicts": len(label_conflicts(pairs)), "label_issues": None,
        "scan": scanned_how, "bad_rows": table_rows(data, inv), "multi_label": multi,
    }
    issues: list[dict[str, Any]] = []
    if labels_skipped:
        summary["label_issues"] = {"flagged": None, "skipped": labels_skipped}
    elif options.labels:
        train_records = [r for r in records if r.split == "train"]
        summary["label_issues"], issues = label_issues(module, datasets["train"], train_records, class_names,
                                                       options)
    summary["seconds"] = {"scan": round(scanned - started, 2), "total": round(time.perf_counter() - started, 2)}
    return Audit(summary, pairs, issues, charts(inv, aspect), datasets)


def findings(summary: dict[str, Any]) -> dict[str, bool]:
    """For each of `FAIL_ON`, whether the audit found it. A label list the report itself calls untrustworthy,
    or a label check that was skipped, finds no label issue."""
    inv, labels = summary["inventory"], summary["label_issues"] or {}
    return {"leakage": bool(summary["leakage"]), "bad_files": bool(inv["bad_files"]),
            "duplicates": bool(summary["duplicates"]["exact"] + summary["duplicates"]["near"]),
            "label_conflicts": bool(summary["label_conflicts"]), "small_classes": bool(inv["small_classes"]),
            "label_issues": bool(labels.get("trusted") and labels.get("flagged"))}
