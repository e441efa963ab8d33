"""`vit probe`: a frozen-feature baseline to run before fine-tuning.

    vit probe --config configs/digits.yaml
    vit probe --config configs/imagenet_vit_small.yaml --data vit.data.ImageFolder --data.root photos/ \\
        --model.init_args.pretrained vit_small_patch16_224.augreg_in21k_ft_in1k

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
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from vit.checkpoint import META_KEY, save_checkpoint
from vit.errors import UserValueError

C_GRID = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
K_GRID = (1, 3, 5, 10, 20, 50)
SPLITS = ("train", "val", "test")
CHECKPOINT_NAME = "linear_probe.ckpt"


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/vit/probe, else ~/.cache/vit/probe."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vit" / "probe"


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
    parser.add_argument("--cache_dir", type=Path, default=default_cache_dir(),
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


def build(argv: list[str]) -> tuple[Any, Any, Path]:
    """(ImageClassifier, ImageDataModule, the folder `vit fit` logs runs in) from `vit fit`'s arguments,
    through the same LightningCLI parser."""
    from vit.cli import DESCRIPTION, VitCLI, experiment_folder

    class ProbeCLI(VitCLI):
        def parse_arguments(self, parser: Any, args: Any) -> None:
            # LightningCLI warns when args differ from sys.argv; ours are sys.argv less the probe's options.
            self.config = parser.parse_args(args)

        def instantiate_trainer(self, **kwargs: Any) -> None:  # the probe never trains: no devices to set up
            return None

    cli = ProbeCLI(model_class=None, datamodule_class=None, subclass_mode_model=True, subclass_mode_data=True,
                   args=argv, run=False, parser_kwargs={"description": DESCRIPTION})
    if not hasattr(cli.model, "eval_model") or not hasattr(cli.datamodule, "eval_split"):
        raise UserValueError(f"vit probe needs an image classifier and an image datamodule, got "
                         f"{type(cli.model).__name__} and {type(cli.datamodule).__name__}")
    cli.model.configure_model()  # the pretrained weights, which a Trainer would load
    return cli.model, cli.datamodule, experiment_folder(cli.config.get("trainer") or {})


# ---- where the run goes, and which splits are held out -------------------------------------------------
def new_run_folder(folder: Path) -> Path:
    """A new ``folder/version_N``, N one past the largest there (as Lightning's loggers number runs)."""
    while True:
        versions = [int(p.name[8:]) for p in folder.glob("version_*") if p.name[8:].isdigit()]
        path = folder / f"version_{max(versions, default=-1) + 1}"
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:  # another probe took it meanwhile
            continue


def test_split_hint(data: Any) -> str:
    """How to give this datamodule a held-out test split."""
    if getattr(data, "split_folders", False):
        return f"add a test/ folder next to {data.root}/train and val"
    if hasattr(data, "test_fraction"):
        return "set --data.test_fraction (e.g. 0.1)"
    if hasattr(data, "val_size"):
        return "set --data.val_size (e.g. 5000) to hold val out of the training images"
    return "give the datamodule a test split apart from val"


# ---- features, cached ---------------------------------------------------------------------------------
def _digest(h: Any, value: Any) -> None:
    if isinstance(value, Tensor):
        h.update(f"{value.dtype}{tuple(value.shape)}".encode())
        h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, np.ndarray):
        h.update(f"{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    else:
        h.update(json.dumps(value, sort_keys=True, default=str).encode())


def weights_key(model: nn.Module, config: dict[str, Any]) -> str:
    """A hash of what the pooled features depend on: the weights below the head and the model config."""
    h = hashlib.sha256()
    _digest(h, {k: v for k, v in config.items() if k != "num_classes" and "drop" not in k})
    for name, tensor in sorted(model.state_dict().items()):
        if not name.startswith("head."):
            _digest(h, name)
            _digest(h, tensor)
    return h.hexdigest()


def data_key(dataset: Dataset) -> str | None:
    """A hash of a split's identity and preparation (files with sizes and mtimes, or the arrays themselves,
    and the transform), or None for a dataset of unknown kind."""
    h = hashlib.sha256()
    _digest(h, [type(dataset).__name__, repr(getattr(dataset, "transform", None))])
    if hasattr(dataset, "samples"):  # image files: paths, labels, sizes, modification times
        for path, label in dataset.samples:
            stat = os.stat(path)
            _digest(h, [str(Path(path).resolve()), int(label), stat.st_size, stat.st_mtime_ns])
    elif hasattr(dataset, "images") and hasattr(dataset, "labels"):  # tensors in memory (the digits)
        for value in (dataset.images, dataset.labels, getattr(dataset, "mean", None), getattr(dataset, "std", None)):
            _digest(h, value)
    elif hasattr(dataset, "indices") and hasattr(getattr(dataset, "dataset", None), "data"):  # CIFAR subsets
        inner = dataset.dataset
        for value in (np.asarray(dataset.indices), np.asarray(inner.data), np.asarray(inner.targets)):
            _digest(h, value)
    else:
        return None
    return h.hexdigest()


@torch.inference_mode()
def extract_features(
    model: nn.Module, dataset: Dataset, batch_size: int, num_workers: int, device: torch.device, description: str,
) -> tuple[Tensor, Tensor]:
    """Pooled pre-logits features (N, D) float32 and labels (N,) of a split, in order."""
    from vit.commands.predict import progress

    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    features, labels = [], []
    for x, y in progress(loader, len(loader), description):
        tokens = model.forward_features(x.to(device))
        features.append(model.forward_head(tokens, pre_logits=True).float().cpu())
        labels.append(torch.as_tensor(y).long())
    return torch.cat(features), torch.cat(labels)


def split_features(
    model: nn.Module, dataset: Dataset, split: str, weights: str, args: argparse.Namespace, device: torch.device,
    num_workers: int,
) -> tuple[Tensor, Tensor, str]:
    """A split's features from the cache when there, else extracted (and cached); and where they came from."""
    data = None if args.no_cache else data_key(dataset)
    path = args.cache_dir / f"{split}-{hashlib.sha256((weights + data).encode()).hexdigest()[:24]}.pt" if data else None
    if path is not None and path.is_file():
        try:
            cached = torch.load(path, map_location="cpu", weights_only=True)
            return cached["features"], cached["labels"], f"loaded from cache {path}"
        except Exception as e:  # unreadable: extract again and overwrite
            print(f"ignoring unreadable feature cache {path} ({type(e).__name__}: {e})")
    features, labels = extract_features(model, dataset, args.batch_size, num_workers, device, f"features: {split}")
    if path is None:
        return features, labels, "extracted" + (" (not cached: unknown dataset kind)" if not args.no_cache else "")
    try:
        save_checkpoint({"features": features, "labels": labels}, path)
    except OSError as e:  # a read-only or full disk costs the next run time, not this run's figures
        return features, labels, f"extracted, not cached ({type(e).__name__}: {e})"
    return features, labels, f"extracted, cached in {path}"


# ---- the two probes -------------------------------------------------------------------------------------
def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
    """Top-1: the fraction of labels predicted."""
    return float(np.mean(predicted == labels))


def blas_threads(n: int, d: int) -> int:
    """BLAS threads for scikit-learn on n x d features: one for small problems, where OpenBLAS's threads cost
    far more than they save (the digits' logistic regression ran 50x slower with 2 threads on a busy 2-core
    machine), else torch's thread count (the config's ``num_threads``)."""
    return 1 if n * d < 1 << 22 else torch.get_num_threads()


def fit_logistic(train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray], grid: Sequence[float]):
    """StandardScaler + multinomial logistic regression on train, C chosen by val top-1 (ties: smaller C).

    Returns (scaler, classifier, C, val top-1)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train[0])
    x_train, x_val = scaler.transform(train[0]), scaler.transform(val[0])
    best = None
    clf = LogisticRegression(max_iter=2000, warm_start=True)  # along the path: each C starts from the last
    for c in sorted(set(grid)):
        clf.set_params(C=c).fit(x_train, train[1])
        score = accuracy(clf.predict(x_val), val[1])
        if best is None or score > best[2]:
            best = (copy.deepcopy(clf), c, score)
    return scaler, *best


def fit_knn(train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray], grid: Sequence[int]):
    """Cosine kNN with majority vote, k chosen by val top-1 (ties: larger k). Returns (classifier, k, val top-1)."""
    from sklearn.neighbors import KNeighborsClassifier

    best = None
    for k in sorted(set(grid), reverse=True):
        knn = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute").fit(*train)
        score = accuracy(knn.predict(val[0]), val[1])
        if best is None or score > best[2]:
            best = (knn, k, score)
    return best


def folded_head(scaler: Any, clf: Any, num_classes: int) -> tuple[Tensor, Tensor]:
    """(weight (num_classes, D), bias) of a Linear head whose softmax equals the scaler + logistic regression's
    predict_proba: logits = W (f - mean) / scale + b = (W / scale) f + (b - W mean / scale)."""
    coef, intercept = clf.coef_, clf.intercept_
    if coef.shape[0] == 1:  # binary: sigmoid(d) = softmax([-d/2, d/2])[1]
        coef, intercept = np.concatenate([-coef, coef]) / 2, np.concatenate([-intercept, intercept]) / 2
    weight = coef / scaler.scale_
    bias = intercept - weight @ scaler.mean_
    full_w = np.zeros((num_classes, weight.shape[1]))
    full_b = np.full(num_classes, -1e4)  # a class without training images is never predicted
    full_w[clf.classes_], full_b[clf.classes_] = weight, bias
    return torch.tensor(full_w, dtype=torch.float32), torch.tensor(full_b, dtype=torch.float32)


def probe_checkpoint(module: Any, head: tuple[Tensor, Tensor], results: dict[str, Any]) -> dict[str, Any]:
    """A `vit fit`-format classify checkpoint: the evaluated backbone with ``head`` as its Linear head."""
    model = module.eval_model
    state = {f"model.{k}": v.detach().cpu().clone() for k, v in model.state_dict().items()}
    state["model.head.weight"], state["model.head.bias"] = head
    meta = {**module.checkpoint_meta(), "ema": False}  # the weights are under "model.", whichever they came from
    return {META_KEY: meta, "state_dict": state, "probe": results}


def main(argv: Sequence[str]) -> dict[str, Any]:
    """Run `vit probe` with the given arguments (without the command name); returns the figures printed.

    ``*_test_acc`` are None, and ``held_out_test`` False, when the data has no test split apart from val."""
    from threadpoolctl import threadpool_limits

    from vit.data.base import no_test_reason

    args, rest = parse_args(argv)
    module, data, experiment = build(rest)
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
        *found[split], how = split_features(model, data.eval_split(split), split, weights, args, device, num_workers)
        print(f"{split}: {len(found[split][1])} images, {found[split][0].shape[1]} features: {how}")
    print(f"features ready in {time.perf_counter() - started:.1f} s")
    as_numpy = lambda split: (found[split][0].numpy().astype(np.float64), found[split][1].numpy()) \
        if split in found else None
    train, val, test = map(as_numpy, SPLITS)  # test: None without a held-out test split

    with threadpool_limits(blas_threads(*train[0].shape), user_api="blas"):
        # Selection sees train and val only; the test split, if any, is scored once, by what val chose.
        scaler, clf, c, lr_val = fit_logistic(train, val, args.C)
        ks = {min(k, len(train[1])) for k in args.k}  # no more neighbours than training images
        knn, k, knn_val = fit_knn(train, val, ks)
        lr_test = None if test is None else accuracy(clf.predict(scaler.transform(test[0])), test[1])
        knn_test = None if test is None else accuracy(knn.predict(test[0]), test[1])
    chosen = lambda grid: f"chosen on val from {', '.join(map(str, sorted(set(grid))))}" if len(set(grid)) > 1 \
        else "fixed"
    scored = lambda val_acc, test_acc: f"val top-1 {val_acc:.4f}, " + (
        "no test figure (no held-out test split)" if test_acc is None else f"test top-1 {test_acc:.4f}")
    print(f"logistic regression (C={c:g}, {chosen(args.C)}): {scored(lr_val, lr_test)}")
    print(f"cosine kNN (k={k}, {chosen(ks)}): {scored(knn_val, knn_test)}")

    results = {"logistic_C": c, "logistic_val_acc": lr_val, "logistic_test_acc": lr_test,
               "knn_k": k, "knn_val_acc": knn_val, "knn_test_acc": knn_test, "held_out_test": test is not None}
    head = folded_head(scaler, clf, module.hparams.num_classes)
    path = args.out or new_run_folder(experiment / "probe") / CHECKPOINT_NAME
    out = save_checkpoint(probe_checkpoint(module, head, results), path)
    print(f"saved the backbone with the logistic-regression head to {out} (vit predict --ckpt {out} IMAGES)")
    return {**results, "checkpoint": str(out)}
