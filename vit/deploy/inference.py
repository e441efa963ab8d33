"""Models to predict with, without Lightning: a `vit fit` checkpoint (torch) or its ONNX export (onnxruntime).

`vit.deploy.load_classifier(path)` returns a `vit.deploy.Classifier` for a checkpoint and an `OnnxClassifier` for
a ``.onnx`` file written by `vit export`. Both map images (B, C, H, W) to logits and carry ``class_names``,
``in_chans``, ``img_size``, ``device`` and ``eval_transform()``, built from the same few numbers, so a
file is prepared the same way whichever runs it. onnxruntime is imported only for ``.onnx`` files.

`ranked` turns logits into the top-k entries of a `record`: `vit predict`, `vit attention` and `vit serve`
answer with the same records.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.deploy.classifier import Classifier, ModelInput, is_multi_label, read_classifier
from vit.deploy.confidence import (
    DEFAULT_LABEL,
    METADATA_KEY,
    SCORE_OUTPUT,
    Calibration,
    decisions,
    tta_logits,
)
from vit.deploy.cpu import has_native_bf16
from vit.deploy.metadata import exported_thresholds, is_int8, load_proto, onnx_metadata
from vit.errors import MissingPackageError, UserPathError, UserValueError

PRECISIONS = ("fp32", "bf16")


ONNX_SUFFIX = ".onnx"


def exported_calibration(meta: dict[str, str]) -> Calibration | None:
    """The calibration an export's metadata carries; None for a model exported before calibration (or never
    calibrated): it answers with T = 1 and cannot say "unknown"."""
    return Calibration.from_dict(json.loads(meta[METADATA_KEY])) if METADATA_KEY in meta else None


class OnnxClassifier(ModelInput):
    """An ONNX classifier from `vit export`, run by onnxruntime on the CPU; metadata says how to prepare images."""

    device = torch.device("cpu")

    def __init__(self, model: str | os.PathLike | bytes, threads: int | None = None, *, name: str | None = None,
                 fuse: bool = True) -> None:
        """``model``: a ``.onnx`` file or its bytes (``name`` then names it in messages); ``fuse``: let onnxruntime
        run our attention as its fused MultiHeadAttention kernel (`vit.deploy.fusion`)."""
        if isinstance(model, bytes):
            path, data = Path(name or "model.onnx"), model
        else:
            path = Path(model)
            if path.is_dir():
                inside = sorted(path.glob("*.onnx"))
                hint = f"; give the file in it: {inside[0]}" if inside else ""
                raise UserPathError(f"{path} is a folder, not an ONNX model{hint}")
            if not path.is_file():
                raise UserPathError(f"ONNX model not found: {path}")
            data = None
        try:
            import onnxruntime
        except ImportError as e:
            raise MissingPackageError(f"running {path} needs onnxruntime: pip install 'vit[export]'") from e
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        proto = load_proto(data if data is not None else path)
        self.int8 = proto is not None and is_int8(proto)
        self.backend = "onnx-int8" if self.int8 else "onnx"
        self.fused: dict[str, int] = {}  # fusion name -> count (`vit.deploy.fusion.fuse_attention`)
        if fuse and proto is not None:
            from vit.deploy.fusion import fuse_attention, fusion_available

            if fusion_available():
                data, self.fused = fuse_attention(proto)
        try:
            self.session = onnxruntime.InferenceSession(data if data is not None else str(path), options,
                                                        providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for unreadable files
            raise UserValueError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from e
        self.path = path
        self.set_card(onnx_metadata(self.session.get_modelmeta().custom_metadata_map, path))
        self.input_name = self.session.get_inputs()[0].name
        self.calibration = exported_calibration(self.session.get_modelmeta().custom_metadata_map)
        self.thresholds = exported_thresholds(self.session.get_modelmeta().custom_metadata_map, path)
        self.has_score = SCORE_OUTPUT in [o.name for o in self.session.get_outputs()]
        self.can_reject = self.has_score and self.calibration is not None and self.calibration.threshold is not None

    def __call__(self, images: Tensor) -> Tensor:
        """Logits (B, num_classes) of images (B, C, H, W)."""
        return self.answer(images)[0]

    def answer(self, images: Tensor) -> tuple[Tensor, Tensor | None]:
        """Logits (B, num_classes) and the unknown score (B,), or None for a model exported without one."""
        outputs = self.session.run(None, {self.input_name: images.float().cpu().numpy()})
        return torch.from_numpy(outputs[0]), torch.from_numpy(outputs[1]) if self.has_score else None


def torch_or_onnx(
    path: str | os.PathLike, device: str | torch.device = "cpu", *, compile: bool = False, threads: int | None = None,
) -> Classifier | OnnxClassifier:
    """A checkpoint as a torch `Classifier` (``compile``: torch.compile it), or an ``.onnx`` file as it is: what
    `vit.deploy.load_classifier` gives without a ``backend``."""
    if Path(path).suffix.lower() == ONNX_SUFFIX:
        if torch.device(device).type != "cpu":
            raise UserValueError(f"{path}: ONNX models run on the CPU here (onnxruntime), not on {device}")
        if compile:
            raise UserValueError(f"{path}: compile applies to checkpoints; onnxruntime optimises ONNX models itself")
        return OnnxClassifier(path, threads)
    classifier = read_classifier(path, device)
    if compile:
        classifier.model.compile()  # in place: the state-dict keys stay the same
    return classifier


def cpu_has_native_bf16() -> bool | None:
    """Whether the CPU computes bf16 in hardware (AVX512-BF16, AMX, Arm BF16); None if unknown (no /proc/cpuinfo).

    Without it, torch emulates bf16 matmuls and autocast runs several times slower than fp32.
    """
    return has_native_bf16()


def autocast(precision: str, device: torch.device | str = "cpu") -> contextlib.AbstractContextManager:
    """torch autocast for ``precision`` ("fp32": none; "bf16"), warning when a CPU only emulates bf16."""
    if precision not in PRECISIONS:
        raise UserValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    device = torch.device(device)
    if device.type == "cpu" and cpu_has_native_bf16() is False:
        warnings.warn("this CPU has no native bf16 (no avx512_bf16/amx_bf16 flag): bf16 autocast is emulated "
                      "and usually several times slower than fp32 here", UserWarning, stacklevel=2)
    return torch.autocast(device.type, dtype=torch.bfloat16)


# ---- records: what `vit predict`, `vit attention` and `vit serve` answer ------------------------
def top_k_entries(probs: Sequence[float], indices: Sequence[int], class_names: Sequence[str]) -> list[dict]:
    """``[{"class": index, "name": ..., "probability": ...}, ...]``, in the order given (most likely first)."""
    return [{"class": int(i), "name": str(class_names[i]), "probability": round(float(p), 6)}
            for p, i in zip(probs, indices)]


def ranked(logits: Tensor, k: int, class_names: Sequence[str], temperature: float = 1.0) -> list[list[dict]]:
    """The `top_k_entries` of each row of ``logits`` (B, classes): the ``k`` largest logits, the model's own order
    (the exports' argmax), with their softmax(logits / T) in float64. Ranked by the logits, not the probabilities:
    a large T (a model near chance fits T = 1e5) leaves float32 probabilities tied where the logits are not."""
    indices = logits.float().topk(k, dim=-1).indices
    values = (logits.double() / temperature).softmax(dim=-1).gather(-1, indices.to(logits.device))
    return [top_k_entries(p, i, class_names) for p, i in zip(values.tolist(), indices.tolist())]


def label_answers(logits: Tensor, thresholds: Sequence[float], k: int, class_names: Sequence[str],
                  calibration: Calibration | None = None) -> list[tuple[list[dict], dict]]:
    """A multi-label model's answers: each image's top-k by sigmoid probability, and ``{"labels": [...]}``, every
    class whose probability is at or over its threshold, most likely first (none is fine). With a temperature per
    class (``calibration.thresholds``): sigmoid(logit / T_c), cut at the thresholds moved with it, so the same
    labels (in float64: the cut and the probability round alike)."""
    if calibration is not None and calibration.thresholds is not None:
        temperature = torch.tensor(calibration.temperature, dtype=torch.float64, device=logits.device)
        probs, thresholds = (logits.double() / temperature).sigmoid(), calibration.thresholds
    else:
        probs = logits.float().sigmoid()  # (B, C)
    over = probs >= torch.tensor(thresholds, dtype=probs.dtype, device=probs.device)
    values, indices = probs.topk(k, dim=-1)
    answers = []
    for row, said, top, top_i in zip(probs.tolist(), over.tolist(), values.tolist(), indices.tolist()):
        labels = sorted((i for i, yes in enumerate(said) if yes), key=lambda i: -row[i])
        answers.append((top_k_entries(top, top_i, class_names),
                        {"labels": top_k_entries([row[i] for i in labels], labels, class_names)}))
    return answers


def chosen_tta(classifier: Any, tta: str | None = None) -> str:
    """``tta`` when given (the user's override), else the one calibration stored (measured on val), else none.
    A multi-label model refuses "flip": its thresholds were chosen on val's plain logits, and flipping was never
    measured against them (the single-label calibration measures it: `vit.deploy.calibration.measure_tta`)."""
    if tta == "flip" and is_multi_label(classifier):
        raise UserValueError("--tta flip is for single-label models: this multi-label model's thresholds were chosen "
                             "on validation images without it, and TTA was not measured there; leave out --tta")
    if tta is not None:
        return tta
    calibration: Calibration | None = getattr(classifier, "calibration", None)
    return calibration.tta if calibration is not None else "none"


def answered(classifier: Any, images: Tensor, k: int, accept_all: bool = False,
             tta: str | None = None) -> list[tuple[list[dict], dict]]:
    """Each image's top-k entries with calibrated probabilities (softmax(logits / T)): always the model's own top
    classes, whatever the answer. Beside them the decision: ``{"answer"}`` (the top class), and for a model with an
    unknown score ``{"answer", "unknown", "score"}`` (the unknown label when the score is over the threshold; never
    with ``accept_all``). ``tta``: "none" or "flip" (None: `chosen_tta`). A multi-label model (`is_multi_label`)
    answers `label_answers` (with its temperature per class when calibrated). `vit predict` and `vit serve` answer
    with this."""
    # the class's own `answer` (a wrapper such as torch-bf16's hands attributes on to the fp32 model inside)
    answer = getattr(classifier, "answer", None) if hasattr(type(classifier), "answer") else None
    logits, scores = answer(images) if answer is not None else (classifier(images), None)
    logits = tta_logits(classifier, images, chosen_tta(classifier, tta), logits)
    calibration: Calibration | None = getattr(classifier, "calibration", None)
    if is_multi_label(classifier):
        return label_answers(logits, classifier.thresholds, k, classifier.class_names, calibration)
    temperature = calibration.temperature if calibration is not None else 1.0
    entries = ranked(logits, k, classifier.class_names, temperature)
    if scores is None:
        return [(e, {"answer": e[0]["name"]}) for e in entries]
    unknown = decisions(scores, calibration, accept_all)
    label = calibration.label if calibration is not None else DEFAULT_LABEL
    return [(e, {"answer": label if u else e[0]["name"], "unknown": u, "score": round(float(s), 6)})
            for e, u, s in zip(entries, unknown, scores.tolist())]


def can_reject(classifier: Any) -> bool:
    """Whether the model answers "unknown": it computes the score (`answered`) and has a threshold."""
    calibration = getattr(classifier, "calibration", None)
    if not hasattr(type(classifier), "answer") or calibration is None or calibration.threshold is None:
        return False
    return bool(getattr(classifier, "can_reject", True))


def record(path: str | os.PathLike, top_k: list[dict] | None = None, error: str | None = None) -> dict:
    """One file's result, the same for `vit predict`, `vit attention` and `vit serve`: path, top_k, error."""
    return {"path": str(path), "top_k": top_k or [], "error": error}
