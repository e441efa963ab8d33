"""Which engine runs a classifier (`vit predict --backend`, `vit serve --backend`), and whether this CPU can.

    backend        reads                                runs
    torch          checkpoint                           PyTorch eager, fp32 (``--precision bf16``: autocast)
    torch-bf16     checkpoint                           PyTorch, the weights cast to bf16 (AMX / AVX512-BF16 only)
    torch-compile  checkpoint                           torch.compile: Inductor, frozen weights, max-autotune
    torch-compile-bf16  checkpoint                      the same, of torch-bf16's model (bf16 CPUs only)
    onnx           checkpoint (exported here) or .onnx  onnxruntime, attention fused (`vit.deploy.fusion`)
    onnx-int8      model.int8.onnx (static or dynamic)  onnxruntime
    openvino       checkpoint or .onnx                  OpenVINO, fp32 kept (its bf16 default turned off)
    openvino-bf16  checkpoint or .onnx                  OpenVINO, bf16 (its default on CPUs with bf16 units)
    openvino-int8  model.int8.onnx (static: QDQ)        OpenVINO, int8; the rest at OpenVINO's default precision
    auto           either                               the fastest of the above within tolerance, measured
                                                        here once and cached (`vit.deploy.auto`)

The exact backends (torch, torch-compile, onnx, openvino) give eager fp32's logits within 1e-4. Every model
returned has ``class_names``, ``img_size``, ``in_chans``, ``device``, ``eval_transform()``, ``backend`` and maps
images (B, C, H, W) to fp32 logits. The CPU's instruction sets come from /proc/cpuinfo (`cpu_flags`): a
backend the CPU cannot run fast is refused with the missing set named, not run slowly.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import shutil
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.deploy import auto
from vit.deploy.altstack import kept_signal_stack
from vit.deploy.classifier import Classifier, ModelInput
from vit.deploy.confidence import SCORE_OUTPUT
from vit.deploy.cpu import describe_cpu, has_amx_bf16, has_native_bf16, has_vnni, reduce_range_for
from vit.deploy.inference import ONNX_SUFFIX, OnnxClassifier, exported_calibration, torch_or_onnx
from vit.deploy.metadata import exported_thresholds, is_int8, load_proto, onnx_metadata
from vit.errors import MissingPackageError, UserValueError
from vit.nn.attention import MultiHeadAttention

BACKENDS = ("torch", "torch-bf16", "torch-compile", "torch-compile-bf16", "onnx", "onnx-int8", "openvino",
            "openvino-bf16", "openvino-int8")
AUTO = "auto"  # not an engine: the choice among BACKENDS (`load_auto`)
BF16_BACKENDS = ("torch-bf16", "torch-compile-bf16", "openvino-bf16")  # refused where bf16 is emulated
EXACT = ("torch", "torch-compile", "onnx", "openvino")  # within 1e-4 of eager fp32's logits
# run an ONNX model (from a file or exported)
ONNX_BACKENDS = ("onnx", "onnx-int8", "openvino", "openvino-bf16", "openvino-int8")


class UnsupportedBackendError(UserValueError):
    """A backend this machine (its CPU, or the model file given) cannot run."""


# ---- checks ------------------------------------------------------------------------------------
def check_backend(backend: str, path: str | os.PathLike, device: str | torch.device = "cpu") -> None:
    """Raise `UnsupportedBackendError` or `MissingPackageError` when ``backend`` cannot run ``path`` here."""
    if backend not in BACKENDS:
        raise UserValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    is_onnx = Path(path).suffix.lower() == ONNX_SUFFIX
    device = torch.device(device)
    if is_onnx and backend.startswith("torch"):
        raise UnsupportedBackendError(f"{path}: --backend {backend} runs a `vit fit` checkpoint; an ONNX file runs "
                                      "with --backend onnx, onnx-int8, openvino, openvino-bf16 or openvino-int8")
    if backend.endswith("int8") and not is_onnx:
        raise UnsupportedBackendError(
            f"{path}: --backend {backend} needs a calibrated int8 file; write it first with `vit export --ckpt "
            f"{path} --format onnx --int8 static --calibration DATA --out DIR`, then pass --ckpt DIR/model.int8.onnx")
    if backend in ONNX_BACKENDS and device.type != "cpu":
        raise UnsupportedBackendError(f"--backend {backend} runs on the CPU, not on {device}; use --backend torch")
    if backend.startswith("openvino") and not _importable("openvino"):
        raise MissingPackageError(f"--backend {backend} needs OpenVINO: pip install 'vit[openvino]'")
    if backend.startswith("onnx") and not _importable("onnxruntime"):
        raise MissingPackageError(f"--backend {backend} needs onnxruntime: pip install 'vit[export]'")
    if backend == "onnx" and not is_onnx and not _importable("onnxscript"):
        raise MissingPackageError("--backend onnx exports the checkpoint first, which needs onnxscript: "
                                  "pip install 'vit[export]'")
    if backend in BF16_BACKENDS and device.type == "cpu" and has_native_bf16() is False:
        raise UnsupportedBackendError(
            f"--backend {backend} needs a CPU with bf16 units (AMX-BF16 or AVX512-BF16); this one has "
            f"{describe_cpu()}, where torch emulates bf16 several times slower than fp32. Use --backend torch, "
            "or onnx-int8 for speed")
    if backend.startswith("torch-compile") and device.type == "cpu" and not any(
            map(shutil.which, ("g++", "c++", "clang++"))):
        raise MissingPackageError(f"--backend {backend} needs a C++ compiler for Inductor's CPU kernels "
                                  "(apt install g++); use --backend onnx or openvino for an exact compiled path")


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# ---- the models ----------------------------------------------------------------------------------
class Bf16Classifier(torch.nn.Module):
    """A checkpoint's classifier with its weights cast to bf16: faster than autocast, which keeps fp32 weights and
    casts them at every matmul.

    On a CPU with AVX512-BF16 but no AMX (AMD Zen 4), attention takes the explicit path (two bf16 matmuls and a
    softmax), which ran faster there than SDPA's bf16 flash kernel; with AMX SDPA stays, as measured. The
    figures of both choices: docs/inference.md.
    """

    backend = "torch-bf16"

    def __init__(self, classifier: Classifier, explicit_attention: bool | None = None) -> None:
        """``explicit_attention=None``: chosen by the CPU as above (SDPA on a GPU)."""
        super().__init__()
        self.classifier = classifier.to(torch.bfloat16).eval()
        if explicit_attention is None:
            explicit_attention = classifier.device.type == "cpu" and has_amx_bf16() is False
        for module in self.classifier.modules():
            if isinstance(module, MultiHeadAttention):
                module.fused_attn = not explicit_attention

    def __getattr__(self, name: str) -> Any:  # class_names, img_size, eval_transform, ...: the classifier's
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.classifier, name)

    @torch.no_grad()
    def forward(self, images: Tensor) -> Tensor:
        return self.classifier(images.to(torch.bfloat16)).float()


def compile_frozen(module: torch.nn.Module, mode: str = "max-autotune-no-cudagraphs") -> Callable[[Tensor], Tensor]:
    """torch.compile with Inductor's freezing: the weights become constants, so max-autotune can prepack them for
    the CPU's GEMM kernels. ViT-S/16 on the AMX machine, 2 threads: 1.75x eager fp32 in one session's
    measurement, 1.0-1.1x in this module's benchmark runs (docs/inference.md): measure before choosing it."""
    from torch._inductor import list_mode_options  # torch.compile takes a mode or options, not both (torch 2.14)

    # dynamic=False: a graph per batch size, each with its own GEMM choices (automatic dynamic shapes would
    # recompile the second size seen for a symbolic batch instead).
    return torch.compile(module, dynamic=False, options={**list_mode_options(mode), "freezing": True})


class CompiledClassifier(torch.nn.Module):
    """A checkpoint's classifier compiled by `compile_frozen` (``bf16``: torch-bf16's model, `Bf16Classifier`).
    Each batch size pays a compile (about a minute for ViT-S/16), so a smaller batch is padded to the smallest
    larger size compiled already: `vit predict`'s last, partial batch reuses the first batch's graph."""

    def __init__(self, classifier: Classifier, mode: str = "max-autotune-no-cudagraphs", pad: bool = True,
                 bf16: bool = False) -> None:
        super().__init__()
        self.classifier, self.pad = classifier.eval(), pad
        self.backend = "torch-compile-bf16" if bf16 else "torch-compile"
        self.compiled = compile_frozen(Bf16Classifier(classifier) if bf16 else self.classifier.model, mode)
        self.sizes: set[int] = set()  # batch sizes compiled so far

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.classifier, name)

    @torch.no_grad()  # freezing applies to inference graphs only
    def forward(self, images: Tensor) -> Tensor:
        n = len(images)
        size = min((s for s in self.sizes if s >= n), default=n) if self.pad else n
        self.sizes.add(size)
        if size > n:  # (B, C, H, W) padded with zeros to a compiled size; their logits dropped
            images = torch.cat([images, images.new_zeros(size - n, *images.shape[1:])])
        return self.compiled(images)[:n]


class OpenVinoClassifier(ModelInput):
    """An ONNX classifier (a file, or bytes exported in memory) compiled by OpenVINO for the CPU.

    ``INFERENCE_PRECISION_HINT`` is f32 for an fp32 model unless ``bf16``: on CPUs with bf16 units OpenVINO's
    default is bf16, which runs silently otherwise. An int8 (QDQ) model runs its int8 layers in int8 and the rest
    at OpenVINO's default precision (bf16 where the CPU has bf16 units: ViT-S/16 at batch 8 on an AVX512-BF16
    AMD EPYC, 3.9x eager fp32 against 3.5x with the rest in f32, no top-1 changed; docs/inference.md).

    A batch size met a second time gets its own model compiled for that fixed shape (up to `STATIC_SHAPES`
    sizes; others, and first sightings such as a folder's last short batch, run the dynamic-batch model):
    OpenVINO picks its int8 kernels for known shapes, ViT-S/16 int8 at batch 8 ran 1.22x faster static on an
    AMX Xeon, bf16 1.03x (docs/speed.md). fp32 logits stay within 1e-5; bf16 and int8 kernels chosen for a fixed
    shape round differently, so their logits move by their usual error (a near-tie may flip, as between runs).
    """

    STATIC_SHAPES = 4

    device = torch.device("cpu")

    def __init__(self, model: str | os.PathLike | bytes, threads: int | None = None, name: str | None = None,
                 bf16: bool = False) -> None:
        import onnx
        import openvino

        data = model if isinstance(model, bytes) else Path(model).read_bytes()
        self.path = Path(name or (model if not isinstance(model, bytes) else "model.onnx"))
        proto = onnx.load_from_string(data)
        self.set_card(onnx_metadata({p.key: p.value for p in proto.metadata_props}, self.path))
        self.int8 = is_int8(proto)
        self.backend = "openvino-int8" if self.int8 else "openvino-bf16" if bf16 else "openvino"
        config: dict[str, Any] = {} if self.int8 else {"INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32"}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        self.core, self.config = openvino.Core(), config
        self.source = self.core.read_model(model=data)
        self.compiled = self._compile(self.source)
        self.static: dict[int, Any] = {}  # batch size -> its fixed-shape compiled model
        self.seen: set[int] = set()
        self.lock = threading.Lock()  # vit serve calls from several threads
        self.calibration = exported_calibration({p.key: p.value for p in proto.metadata_props})
        self.thresholds = exported_thresholds({p.key: p.value for p in proto.metadata_props}, self.path)
        self.has_score = SCORE_OUTPUT in {name for output in self.compiled.outputs for name in output.get_names()}
        self.can_reject = self.has_score and self.calibration is not None and self.calibration.threshold is not None

    def __call__(self, images: Tensor) -> Tensor:
        """Logits (B, num_classes) of images (B, C, H, W)."""
        return self.answer(images)[0]

    def _compile(self, model: Any) -> Any:
        with kept_signal_stack():  # OpenVINO would leave this thread a dangling one (vit.deploy.altstack)
            return self.core.compile_model(model, "CPU", self.config)

    def compiled_for(self, batch: int) -> Any:
        """The compiled model to run a batch of this size: its fixed-shape one from its second sighting on."""
        with self.lock:
            if batch not in self.static and batch in self.seen and len(self.static) < self.STATIC_SHAPES:
                fixed = self.source.clone()
                fixed.reshape({fixed.inputs[0]: [batch, *fixed.inputs[0].get_partial_shape()[1:]]})
                self.static[batch] = self._compile(fixed)
            self.seen.add(batch)
            return self.static.get(batch, self.compiled)

    def answer(self, images: Tensor) -> tuple[Tensor, Tensor | None]:
        """Logits and the unknown score (B,), or None for a model exported without one."""
        outputs = self.compiled_for(len(images))(images.float().cpu().numpy())
        score = torch.from_numpy(outputs[1].copy()) if self.has_score else None
        return torch.from_numpy(outputs[0].copy()), score


def load_classifier(
    path: str | os.PathLike, device: str | torch.device = "cpu", *, backend: str | None = None,
    threads: int | None = None, compile: bool = False, batch_size: int = 8, sample: Any = None,
    workload: int | None = None,
) -> Any:
    """A trained classifier to run: a `vit fit` checkpoint or a `vit export` ``.onnx`` file, on ``backend``.

    ``backend=None``: torch for a checkpoint (a `Classifier`), onnxruntime for an ONNX file as it is (fp32 or
    int8). Whatever runs it has the input card (`ModelInput`) and maps images (B, C, H, W) to logits.
    ``backend="auto"``: `load_auto`, which takes ``batch_size``, ``sample`` and ``workload``.
    """
    if backend is None:  # onnxruntime runs an ONNX file as it is (fp32 or int8), torch a checkpoint
        return torch_or_onnx(path, device, compile=compile, threads=threads)
    if backend == AUTO:
        if compile:
            raise UserValueError("--compile applies to --backend torch; --backend auto chooses the engine itself")
        return load_auto(path, device, threads=threads, batch_size=batch_size, sample=sample, workload=workload)
    is_onnx = Path(path).suffix.lower() == ONNX_SUFFIX
    check_backend(backend, path, device)
    if compile and backend != "torch":
        raise UserValueError(f"--compile applies to --backend torch; --backend {backend} is compiled its own way")
    if is_onnx:
        return onnx_engine(path, backend, threads)
    return checkpoint_engine(torch_or_onnx(path, device, compile=compile, threads=threads), backend, path, threads)


def onnx_engine(path: str | os.PathLike, backend: str, threads: int | None) -> Any:
    """An ``.onnx`` file on an ONNX backend that `check_backend` accepted."""
    import onnx

    proto = onnx.load(path)
    int8 = is_int8(proto)
    if backend.endswith("int8") != int8:
        fits = backend.split("-")[0] + "-int8" if int8 else backend.removesuffix("-int8")
        raise UnsupportedBackendError(
            f"{path} is an {'int8' if int8 else 'fp32'} model and --backend {backend} runs "
            f"{'int8 files (vit export --int8 static)' if backend.endswith('int8') else 'fp32 files'}: "
            f"use --backend {fits}")
    if int8 and backend == "onnx-int8":
        warn_if_range_saturates(proto, path)
    if int8 and backend == "openvino-int8" and has_vnni() is False:
        warnings.warn(f"--backend openvino-int8 on a CPU without VNNI ({describe_cpu()}): OpenVINO's int8 is slow "
                      "here (on an AVX2 AMD EPYC, ViT-S/16 ran at 0.4-0.7x fp32 eager at batch 8, where onnx-int8 "
                      "ran 1.0-1.1x); --backend onnx-int8 runs the same file (docs/inference.md)",
                      UserWarning, stacklevel=3)
    if backend.startswith("openvino"):
        return OpenVinoClassifier(path, threads, bf16=backend == "openvino-bf16")
    return OnnxClassifier(path, threads)


def checkpoint_engine(classifier: Any, backend: str, path: str | os.PathLike, threads: int | None,
                      exported: Callable[[], bytes] | None = None) -> Any:
    """A checkpoint's classifier on ``backend``; ``exported()``: its ONNX bytes (default: exported here)."""
    if backend == "torch":
        return classifier
    if backend == "torch-bf16":
        return Bf16Classifier(classifier)
    if backend.startswith("torch-compile"):
        return CompiledClassifier(classifier, bf16=backend.endswith("bf16"))
    from vit.deploy.export import exact_onnx  # the checkpoint through the same export and check as `vit export`

    data = exported() if exported is not None else exact_onnx(classifier)
    name = Path(path).with_suffix(ONNX_SUFFIX).name
    if backend.startswith("openvino"):
        return OpenVinoClassifier(data, threads, name, bf16=backend == "openvino-bf16")
    return OnnxClassifier(data, threads, name=name)


# ---- --backend auto --------------------------------------------------------------------------------
def auto_candidates(path: str | os.PathLike, device: str | torch.device = "cpu") -> list[str]:
    """The backends `--backend auto` times for ``path`` here, the reference first (eager fp32 for a checkpoint,
    onnxruntime for an ONNX file). Left out: what `check_backend` refuses here, and torch-compile(-bf16), whose
    compile (20-60 s a batch size for ViT-S/16) alone would spend the time budget."""
    if torch.device(device).type != "cpu":
        return ["torch"]
    if Path(path).suffix.lower() == ONNX_SUFFIX:
        proto = load_proto(Path(path))
        names = ["onnx-int8", "openvino-int8"] if proto is not None and is_int8(proto) else \
            ["onnx", "openvino", "openvino-bf16"]
    else:
        # the likelier winners first (docs/speed.md): a candidate the budget leaves unmeasured is never chosen
        names = ["torch", "openvino-bf16", "torch-bf16", "openvino", "onnx"]
    runnable = []
    for name in names:
        with contextlib.suppress(UserValueError, MissingPackageError):
            check_backend(name, path, device)
            runnable.append(name)
    return runnable


def load_auto(path: str | os.PathLike, device: str | torch.device = "cpu", *, threads: int | None = None,
              batch_size: int = 8, sample: Any = None, workload: int | None = None,
              budget_s: float = auto.BUDGET_S, names: Sequence[str] | None = None) -> Any:
    """The fastest backend for ``path`` here within tolerance, measured once per (file, CPU flags, threads, batch
    size) and cached beside it (`vit.deploy.auto`). ``sample``: images (N, C, H, W) to measure on, or a function of
    the reference model that gives them (None: seeded noise); ``workload``: images the run will classify (None:
    a server). The model returned has ``auto``: the choice and the measurements."""
    names = list(names or auto_candidates(path, device))
    if Path(path).suffix.lower() == ONNX_SUFFIX or len(names) == 1:
        def build(name: str) -> Any:
            return load_classifier(path, device, backend=name, threads=threads)
    else:
        build = _checkpoint_builder(path, device, threads)

    def images(reference: Any) -> Tensor:
        got = sample(reference) if callable(sample) else sample
        return got if got is not None else auto.synthetic_images((reference.in_chans, *reference.img_size))

    model, choice = auto.auto_choice(path, names, build, images, flags=describe_cpu(),
                                     threads=threads or torch.get_num_threads(), batch_size=batch_size,
                                     workload=workload, budget_s=budget_s)
    model.auto = choice
    return model


def _checkpoint_builder(path: str | os.PathLike, device: str | torch.device, threads: int | None
                        ) -> Callable[[str], Any]:
    """Builds each candidate from one read of the checkpoint and one ONNX export; each model's ``build_extra_s``
    adds back the read (and export) it shared, so build times compare as if each were built alone."""
    from vit.deploy.export import exact_onnx

    start = time.perf_counter()
    base = torch_or_onnx(path, device, threads=threads)
    read_s = time.perf_counter() - start
    export: dict[str, Any] = {}

    def exported() -> bytes:
        if "data" not in export:
            start = time.perf_counter()
            export["data"] = exact_onnx(base)
            export["s"] = time.perf_counter() - start
        return export["data"]

    def build(name: str) -> Any:
        model = checkpoint_engine(base if name == "torch" else copy.deepcopy(base), name, path, threads, exported)
        model.build_extra_s = read_s + (export["s"] if name in ONNX_BACKENDS else 0.0)
        return model

    return build


def warn_if_range_saturates(proto: Any, path: str | os.PathLike) -> None:
    """Warn when a static int8 file with full-range weights runs on an x86 CPU without VNNI (see `reduce_range_for`)."""
    import json

    meta = {p.key: p.value for p in proto.metadata_props}
    quant = json.loads(meta.get("quantization", "{}"))
    if quant.get("reduce_range") is False and reduce_range_for():
        warnings.warn(f"{path} was quantised for a CPU with VNNI (8-bit weights); this CPU ({describe_cpu()}) has no "
                      "VNNI, where onnxruntime's int8 kernel can saturate. Export it again on this machine "
                      "(vit export --int8 static picks 7-bit weights here)", UserWarning, stacklevel=3)
