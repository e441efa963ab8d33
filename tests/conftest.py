"""Test-wide settings (headless plotting, no network, seeds) and the fixtures tests share."""

import os

# Set before anything imports matplotlib, wandb or huggingface_hub.
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # fail fast instead of retrying for a minute offline
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import contextlib
import csv
import fcntl
import json
import logging
import shutil
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests import CONFIGS
from tests.helpers import TINY_DIM

DIGITS = str(CONFIGS / "digits.yaml")

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:  # the test processes share the cores instead of each taking all
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def free_port() -> int:
    """A localhost port free now, for a 2-process test's rendezvous (rather than one Lightning picks while others
    bind)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child `vit` run, without the distributed variables an in-process
    DDP trainer leaves behind (a child that sees LOCAL_RANK thinks it was launched as one rank and waits)."""
    launched = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK",
                "LOCAL_WORLD_SIZE", "PL_GLOBAL_SEED", "PL_SEED_WORKERS")
    env = {k: v for k, v in os.environ.items() if k not in launched and not k.startswith("PL_")}
    return {**env, "PYTHONPATH": str(CONFIGS.parent), **extra}


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """torch's thread count and Lightning's seed variables as they were before the block. An in-process `vit fit`
    sets both for the whole process (its config's ``num_threads``; ``seed_everything``'s PL_GLOBAL_SEED, which a
    later unseeded fit takes as its seed): after the digits fit, the multi-label fixture trained on one thread, to
    other weights, and the tests after it computed on one thread."""
    threads = torch.get_num_threads()
    seeds = {name: os.environ.get(name) for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")}
    try:
        yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        for name, value in seeds.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(autouse=True)
def _seed_and_workdir(tmp_path, monkeypatch):
    """Every test starts seeded, in a folder of its own: relative paths in recipes (logs/...) land there; the
    threads and seed variables a `vit fit` in it sets are undone after it."""
    torch.manual_seed(0)
    monkeypatch.chdir(tmp_path)
    with process_state_kept():
        yield


class SharedFixturesKeepState:
    """A fixture that several tests share (a session's `vit fit` or `vit calibrate`) leaves the threads and seed
    variables as it found them too; a test's own fixtures (`one_thread`) set them for that test on purpose. A
    plugin, not a conftest hook: pytest asks the session's hooks for a session fixture, and this conftest's are
    not among them."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope == "function":
            return (yield)
        with process_state_kept():
            return (yield)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SharedFixturesKeepState(), "vit-shared-fixtures-keep-state")


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread for the test: on tiny tensors a second only adds synchronisation (10x slower on a
    busy 2-core machine), and a loader worker runs with one. Modules use it with ``usefixtures``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def without_pillow_heif(monkeypatch) -> None:
    """As where the optional pillow-heif is not installed: PIL has no HEIF reader, and vit names .heic files as
    photos it cannot read (the test environment installs pillow-heif, with the dev extra)."""
    from vit.data import io
    from vit.serve import core

    monkeypatch.setattr(Image, "ID", [plugin for plugin in Image.ID if plugin != "HEIF"])
    monkeypatch.delitem(Image.OPEN, "HEIF", raising=False)
    monkeypatch.setattr(io, "READS_HEIC", False)
    monkeypatch.setattr(io, "IMAGE_EXTENSIONS", tuple(e for e in io.IMAGE_EXTENSIONS if e not in io.HEIF_EXTENSIONS))
    monkeypatch.setattr(io, "UNREADABLE_PHOTO_EXTENSIONS", io.HEIF_EXTENSIONS + io.UNREADABLE_PHOTO_EXTENSIONS)
    monkeypatch.setattr(core, "READS_HEIC", False)
    monkeypatch.setattr(core, "ACCEPTED_FORMATS", tuple(f for f in core.ACCEPTED_FORMATS if f != "HEIF"))
    monkeypatch.setattr(core, "ACCEPTED_NAMES", core.ACCEPTED_NAMES.replace(", PNM or HEIC", " or PNM"))


@pytest.fixture(autouse=True)
def _logger_levels_restored() -> Iterator[None]:
    """Logger levels a test (or a script's main() it runs) sets do not leak into later tests: the scripts quiet
    lightning.pytorch and vit.checkpoints.weights for their own runs, which hid later tests' captured messages."""
    loggers = logging.Logger.manager.loggerDict
    before = {name: logger.level for name, logger in loggers.items() if isinstance(logger, logging.Logger)}
    yield
    for name, logger in list(loggers.items()):
        if isinstance(logger, logging.Logger) and logger.level != before.get(name, logging.NOTSET):
            logger.setLevel(before.get(name, logging.NOTSET))


def quiet_run(root: Path, *configs: str, calibrate: bool | str = False) -> list[str]:
    """Arguments that run the recipe ``configs`` (the digits by default) with its outputs under ``root``,
    quietly. Later configs (e.g. a logger's) override earlier ones. ``calibrate``: `vit fit --calibrate` (false
    unless asked: the tests' fits skip calibration's time)."""
    return [
        *(a for config in configs or (DIGITS,) for a in ("--config", config)),
        f"--trainer.default_root_dir={root}", f"--trainer.logger.init_args.save_dir={root}/logs",
        f"--checkpoint.dirpath={root}/ckpt", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--calibrate={str(calibrate).lower()}",
    ]


def short_digits_run(root: Path, *extra: str, steps: int = 4) -> list[str]:
    """Arguments for a seconds-long digits run (a tiny model, a few steps) that writes only under ``root``.

    ``extra`` may name more configs (``"--config", "configs/loggers/wandb.yaml"``) and options.
    """
    configs = [extra[i + 1] for i, a in enumerate(extra) if a == "--config"]
    options = [a for i, a in enumerate(extra) if a != "--config" and (i == 0 or extra[i - 1] != "--config")]
    return [
        *quiet_run(root, DIGITS, *configs), *options, "--trainer.max_epochs=1", "--trainer.log_every_n_steps=1",
        f"--trainer.limit_train_batches={steps}", "--trainer.limit_val_batches=2",
        f"--model.init_args.model_kwargs={{depth: 1, embed_dim: {TINY_DIM}, num_heads: 2}}",
    ]


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder of a session fixture that ``build`` fills. Under pytest-xdist the test processes share it:
    the first to ask builds it while the others wait on a lock, so a fit runs once per suite, not per worker."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        root = tmp_path_factory.mktemp(name)
        build(root)
        return root
    root = tmp_path_factory.getbasetemp().parent / name  # the workers' basetemps share this parent
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / ".built").exists():
            shutil.rmtree(root, ignore_errors=True)  # a half-built folder from a worker that crashed
            root.mkdir()
            build(root)
            (root / ".built").touch()
    return root


@pytest.fixture(scope="session")
def fitted(tmp_path_factory) -> Path:
    """One seconds-long `vit fit` of the digits recipe (a tiny model), for tests of the commands' plumbing."""
    from vit.commands import main

    return built_once(tmp_path_factory, "fit", lambda root: main(["fit", *short_digits_run(root)]))


@dataclass
class DigitsRun:
    """A `vit fit` of the digits recipe that learnt: its folder, checkpoints and logged metrics."""

    root: Path
    best: Path
    last: Path
    metrics: list[dict[str, str]]

    def metric(self, name: str) -> float:
        """The last logged value of ``name``."""
        return float([row[name] for row in self.metrics if row.get(name)][-1])


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory) -> DigitsRun:
    """The real digits recipe, shortened to 15 epochs without EMA (about 30 s): test top-1 about 0.92.

    Shared by the tests that need a checkpoint whose predictions mean something.
    """
    from vit.commands import main

    root = built_once(tmp_path_factory, "digits_run", lambda root: main([
        "fit", *quiet_run(root), "--trainer.max_epochs=15", "--model.init_args.optim.warmup_epochs=1",
        "--model.init_args.optim.ema_decay=null"]))
    metrics = list(csv.DictReader((root / "logs" / "digits" / "version_0" / "metrics.csv").open()))
    return DigitsRun(root, next((root / "ckpt").glob("best-*.ckpt")), root / "ckpt" / "last.ckpt", metrics)


@pytest.fixture(scope="session")
def digit_pngs(tmp_path_factory) -> tuple[list[Path], np.ndarray]:
    """The 359 test digits of `vit.data.Digits` as 8x8 grayscale PNGs, and their labels."""
    from sklearn.datasets import load_digits

    from vit.data.io import stratified_split

    folder = tmp_path_factory.mktemp("digit_pngs")
    digits = load_digits()
    test_idx = stratified_split(digits.target, [0.1, 0.2], seed=0)[2]
    paths = []
    for k, i in enumerate(test_idx):
        path = folder / f"{k:03d}_{digits.target[i]}.png"
        Image.fromarray(np.clip(digits.images[i] * 16, 0, 255).astype(np.uint8)).save(path)
        paths.append(path)
    return paths, digits.target[test_idx]


@dataclass
class Exported:
    """The `fitted` checkpoint exported by `vit export`: ONNX (fp32 and int8) and safetensors."""

    ckpt: Path
    onnx: Path
    onnx_int8: Path
    safetensors: Path  # the folder: model.safetensors + config.json
    printed: str


@pytest.fixture(scope="session")
def exported(fitted, tmp_path_factory) -> Exported:
    """One export of each format (the ONNX exporter takes several seconds), shared by the tests."""
    import contextlib
    import io

    from vit.commands import main

    best = next((fitted / "ckpt").glob("best-*.ckpt"))

    def export(root: Path) -> None:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            main(["export", "--ckpt", str(best), "--format", "onnx", "--out", str(root / "onnx"),
                  "--quantize", "int8"])
            main(["export", "--ckpt", str(best), "--format", "safetensors", "--out", str(root / "st")])
        (root / "printed.txt").write_text(printed.getvalue())

    root = built_once(tmp_path_factory, "exported", export)
    return Exported(best, root / "onnx" / "model.onnx", root / "onnx" / "model.int8.onnx", root / "st",
                    (root / "printed.txt").read_text())


@pytest.fixture(scope="session")
def sharded(tmp_path_factory) -> tuple[Path, Path, dict]:
    """A single-folder image set (3 classes x 10, one truncated file) and its shards, with the webdataset, written
    by `vit shard`; and the info it returned. Shared: read it, never write into it."""
    from tests.data.conftest import MODES
    from tests.formats import write_class_folders
    from vit.commands.shard import main as shard

    def build(root: Path) -> None:
        folder = root / "photos"
        write_class_folders(folder, ["ant", "bee", "cat"], per_class=10, modes=MODES, size=20)
        good = (folder / "ant" / "img_0.jpg").read_bytes()
        (folder / "bee" / "broken.jpg").write_bytes(good[: len(good) // 2])  # a header that passes, data cut short
        info = shard([str(folder), str(root / "out"), "--webdataset", "--num_workers", "2"])
        (root / "returned.json").write_text(json.dumps(info))

    root = built_once(tmp_path_factory, "sharded", build)
    return root / "photos", root / "out", json.loads((root / "returned.json").read_text())


@contextlib.contextmanager
def umask(mask: int) -> Iterator[int]:
    """Run the block under the process umask ``mask``; yields the mode a new file gets (0644 under 022)."""
    old = os.umask(mask)
    try:
        yield 0o666 & ~mask
    finally:
        os.umask(old)


@pytest.fixture(autouse=True)
def no_process_group_left_behind() -> Iterator[None]:
    """An in-process DDP run (world size 1, e.g. scripts/gpu/gpu_check.py on the CPU) leaves torch.distributed
    initialised, and every later test would then log as if distributed. Destroy it after the test."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def calibrated(fitted, tmp_path_factory) -> tuple[Path, str]:
    """The `fitted` checkpoint, calibrated by `vit calibrate` into a copy; what it printed. Tests only read it."""
    import io

    from vit.commands import main

    root = tmp_path_factory.mktemp("calibrated")
    ckpt = root / "calibrated.ckpt"
    shutil.copy(next((fitted / "ckpt").glob("best-*.ckpt")), ckpt)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(["calibrate", "--ckpt", str(ckpt), "--config", DIGITS])
    return ckpt, printed.getvalue()


def fit_quadrant_labels(root: Path) -> None:
    """A tiny multi-label classifier fitted by `vit fit` in seconds on `tests.dummies.QuadrantLabels`, its best
    checkpoint (by val macro mAP, with the thresholds chosen on val) copied to ``root/model.ckpt``, and the test
    images as PNGs under ``root/images``."""
    from tests.dummies import quadrant_pixels
    from vit.commands import main

    main(["fit", "--model=vit.tasks.ImageClassifier", "--model.model=vit_digits_patch2_8",
          f"--model.model_kwargs={{depth: 2, embed_dim: {TINY_DIM}, num_heads: 2}}",
          "--model.optim={lr: 0.003, warmup_epochs: 0}", "--data=tests.dummies.QuadrantLabels",
          "--seed_everything=0", "--trainer.max_epochs=12", "--trainer.accelerator=cpu", "--trainer.logger=false",
          "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
          f"--trainer.default_root_dir={root}", f"--checkpoint.dirpath={root / 'ckpt'}", "--checkpoint.monitor=val_map",
          "--test_after_fit=false", "--calibrate=false"])  # the uncalibrated model the tests calibrate themselves
    shutil.copy(next((root / "ckpt").glob("best-*.ckpt")), root / "model.ckpt")
    (root / "images").mkdir()
    pixels, targets = quadrant_pixels(67, seed=2)  # QuadrantLabels' test split
    for i, image in enumerate(pixels):
        Image.fromarray(image[0].numpy()).save(root / "images" / f"{i:03d}.png")
    torch.save(targets, root / "targets.pt")


@pytest.fixture(scope="session")
def quadrant_run(tmp_path_factory) -> Path:
    """The folder of `fit_quadrant_labels`: model.ckpt, images/*.png and their targets.pt."""
    return built_once(tmp_path_factory, "quadrant_run", fit_quadrant_labels)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The integration runs (marked slow) first: with --dist worksteal the short tests then fill in around them,
    and no long fit starts last while the other process has nothing left to take."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order within each


@pytest.fixture(autouse=True)
def signal_stack_kept() -> Iterator[None]:
    """No test leaves the process's alternate signal stack changed. OpenVINO's CPU plugin load replaced it with one it
    later unmaps (`vit.deploy.altstack`): a later crash handler then could not run, and the kernel killed the xdist
    worker with a bare SIGSEGV, tests later. A test that changes it fails here, naming the change; the stack it had
    is given back so that the tests after it run on a sound one."""
    from vit.deploy.altstack import kept_signal_stack, signal_stack

    before = signal_stack()
    with kept_signal_stack():
        yield
        after = signal_stack()
    assert after == before, f"the alternate signal stack changed from {before} to {after} (vit/deploy/altstack.py)"
