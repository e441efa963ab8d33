"""Which engine runs a classifier (`vit predict --backend`, `vit serve --backend`), and whether this CPU can.

    backend        reads                                runs
    torch          checkpoint                           PyTorch eager, fp32 (``--precision bf16``: autocast)
    torch-bf16     checkpoint                           PyTorch, the weights cast to bf16 (AMX / AVX512-BF16 only)
    torch-compile  checkpoint                           torch.compile: Inductor, frozen weights, max-autotune
    onnx           checkpoint (exported here) or .onnx  onnxruntime, attention fused (`vit.deploy.fusion`)
    onnx-int8      model.int8.onnx (static or dynamic)  onnxruntime
    openvino       checkpoint or .onnx                  OpenVINO, fp32 kept (its bf16 default turned off)
    openvino-int8  model.int8.onnx (static: QDQ)        OpenVINO, int8

The exact backends (torch, torch-compile, onnx, openvino) give eager fp32's logits within 1e-4. Every model
returned has ``class_names``, ``img_size``, ``in_chans``, ``device``, ``eval_transform()``, ``backend`` and maps
images (B, C, H, W) to fp32 logits. The CPU's instruction sets come from /proc/cpuinfo (`cpu_flags`): a
backend the CPU cannot run fast is refused with the missing set named, not run slowly.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.deploy.classifier import Classifier, ModelInput
from vit.deploy.confidence import SCORE_OUTPUT
from vit.deploy.cpu import describe_cpu, has_amx_bf16, has_native_bf16, has_vnni, reduce_range_for
from vit.deploy.inference import ONNX_SUFFIX, OnnxClassifier, exported_calibration, torch_or_onnx
from vit.deploy.metadata import exported_thresholds, is_int8, onnx_metadata
from vit.errors import MissingPackageError, UserValueError
from vit.nn.attention import MultiHeadAttention

BACKENDS = ("torch", "torch-bf16", "torch-compile", "onnx", "onnx-int8", "openvino", "openvino-int8")
EXACT = ("torch", "torch-compile", "onnx", "openvino")  # within 1e-4 of eager fp32's logits
ONNX_BACKENDS = ("onnx", "onnx-int8", "openvino", "openvino-int8")  # run an ONNX model (from a file or exported)


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
                                      "with --backend onnx, onnx-int8, openvino or openvino-int8")
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
    if backend == "torch-bf16" and device.type == "cpu" and has_native_bf16() is False:
        raise UnsupportedBackendError(
            f"--backend torch-bf16 needs a CPU with bf16 units (AMX-BF16 or AVX512-BF16); this one has "
            f"{describe_cpu()}, where torch emulates bf16 several times slower than fp32. Use --backend torch, "
            "or onnx-int8 for speed")
    if backend == "torch-compile" and device.type == "cpu" and not any(map(shutil.which, ("g++", "c++", "clang++"))):
        raise MissingPackageError("--backend torch-compile needs a C++ compiler for Inductor's CPU kernels "
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
    """A checkpoint's classifier compiled by `compile_frozen`. Each batch size pays a compile (about a minute for
    ViT-S/16), so a smaller batch is padded to the smallest larger size compiled already: `vit predict`'s last,
    partial batch reuses the first batch's graph."""

    backend = "torch-compile"

    def __init__(self, classifier: Classifier, mode: str = "max-autotune-no-cudagraphs", pad: bool = True) -> None:
        super().__init__()
        self.classifier, self.pad = classifier.eval(), pad
        self.compiled = compile_frozen(self.classifier.model, mode)
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

    ``INFERENCE_PRECISION_HINT`` is set to f32 for an fp32 model: on CPUs with bf16 units OpenVINO otherwise
    runs bf16, silently. An int8 (QDQ) model runs its int8 layers in int8 either way.
    """

    device = torch.device("cpu")

    def __init__(self, model: str | os.PathLike | bytes, threads: int | None = None, name: str | None = None) -> None:
        import onnx
        import openvino

        data = model if isinstance(model, bytes) else Path(model).read_bytes()
        self.path = Path(name or (model if not isinstance(model, bytes) else "model.onnx"))
        proto = onnx.load_from_string(data)
        self.set_card(onnx_metadata({p.key: p.value for p in proto.metadata_props}, self.path))
        self.int8 = is_int8(proto)
        self.backend = "openvino-int8" if self.int8 else "openvino"
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        core = openvino.Core()
        self.compiled = core.compile_model(core.read_model(model=data), "CPU", config)
        self.calibration = exported_calibration({p.key: p.value for p in proto.metadata_props})
        self.thresholds = exported_thresholds({p.key: p.value for p in proto.metadata_props}, self.path)
        self.has_score = SCORE_OUTPUT in {name for output in self.compiled.outputs for name in output.get_names()}
        self.can_reject = self.has_score and self.calibration is not None and self.calibration.threshold is not None

    def __call__(self, images: Tensor) -> Tensor:
        """Logits (B, num_classes) of images (B, C, H, W)."""
        return self.answer(images)[0]

    def answer(self, images: Tensor) -> tuple[Tensor, Tensor | None]:
        """Logits and the unknown score (B,), or None for a model exported without one."""
        outputs = self.compiled(images.float().cpu().numpy())
        score = torch.from_numpy(outputs[1].copy()) if self.has_score else None
        return torch.from_numpy(outputs[0].copy()), score


def load_classifier(
    path: str | os.PathLike, device: str | torch.device = "cpu", *, backend: str | None = None,
    threads: int | None = None, compile: bool = False,
) -> Any:
    """A trained classifier to run: a `vit fit` checkpoint or a `vit export` ``.onnx`` file, on ``backend``.

    ``backend=None``: torch for a checkpoint (a `Classifier`), onnxruntime for an ONNX file as it is (fp32 or
    int8). Whatever runs it has the input card (`ModelInput`) and maps images (B, C, H, W) to logits.
    """
    if backend is None:  # onnxruntime runs an ONNX file as it is (fp32 or int8), torch a checkpoint
        return torch_or_onnx(path, device, compile=compile, threads=threads)
    is_onnx = Path(path).suffix.lower() == ONNX_SUFFIX
    check_backend(backend, path, device)
    if compile and backend != "torch":
        raise UserValueError(f"--compile applies to --backend torch; --backend {backend} is compiled its own way")
    if is_onnx:
        import onnx

        proto = onnx.load(path)
        int8 = is_int8(proto)
        if backend.endswith("int8") != int8:
            fits = backend + "-int8" if int8 else backend.removesuffix("-int8")
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
                          UserWarning, stacklevel=2)
        if backend.startswith("openvino"):
            return OpenVinoClassifier(path, threads)
        return OnnxClassifier(path, threads)
    classifier = torch_or_onnx(path, device, compile=compile, threads=threads)
    if backend == "torch":
        return classifier
    if backend == "torch-bf16":
        return Bf16Classifier(classifier)
    if backend == "torch-compile":
        return CompiledClassifier(classifier)
    from vit.deploy.export import exact_onnx  # the checkpoint through the same export and check as `vit export`

    data = exact_onnx(classifier)
    name = Path(path).with_suffix(ONNX_SUFFIX).name
    if backend == "openvino":
        return OpenVinoClassifier(data, threads, name)
    return OnnxClassifier(data, threads, name=name)


def warn_if_range_saturates(proto: Any, path: str | os.PathLike) -> None:
    """Warn when a static int8 file with full-range weights runs on an x86 CPU without VNNI (see `reduce_range_for`)."""
    import json

    meta = {p.key: p.value for p in proto.metadata_props}
    quant = json.loads(meta.get("quantization", "{}"))
    if quant.get("reduce_range") is False and reduce_range_for():
        warnings.warn(f"{path} was quantised for a CPU with VNNI (8-bit weights); this CPU ({describe_cpu()}) has no "
                      "VNNI, where onnxruntime's int8 kernel can saturate. Export it again on this machine "
                      "(vit export --int8 static picks 7-bit weights here)", UserWarning, stacklevel=3)
