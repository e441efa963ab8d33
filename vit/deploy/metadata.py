"""The export metadata: the keys that travel with an exported model, how they are written and read back.

`vit export` writes the classifier's name, classes and input preparation into an ONNX model's
``metadata_props`` (JSON strings); `OnnxClassifier`, `OpenVinoClassifier` and `vit serve` read the same keys
back, so a file is prepared the same way whichever engine runs it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vit.checkpoints.meta import MULTI_LABEL_KEY, THRESHOLDS_KEY
from vit.deploy.classifier import CARD_KEYS
from vit.errors import UserValueError

# What `vit predict model.onnx` reads back from the metadata (JSON strings): the input card.
METADATA_KEYS = CARD_KEYS
# A multi-label model's: {"thresholds": [one per class]}; absent for a single-label one (`vit.checkpoints.meta`)
LABELS_KEY = MULTI_LABEL_KEY


def label_metadata(thresholds: list[float] | None) -> dict[str, Any]:
    """What a multi-label model adds to its export's metadata (nothing for a single-label one)."""
    return {} if thresholds is None else {LABELS_KEY: {THRESHOLDS_KEY: [float(t) for t in thresholds]}}


def exported_thresholds(meta: dict[str, str], path: str | os.PathLike) -> list[float] | None:
    """The per-class thresholds an export's metadata carries; None for a single-label model."""
    if LABELS_KEY not in meta:
        return None
    try:
        return [float(t) for t in json.loads(meta[LABELS_KEY])[THRESHOLDS_KEY]]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise UserValueError(f"{path}: the metadata's {LABELS_KEY!r} is not {{\"thresholds\": [...]}} ({e}); "
                             "export the model again with `vit export`") from e


def set_metadata(proto: Any, values: dict[str, Any]) -> None:
    """Write ``values`` into an ONNX ModelProto's metadata_props as JSON strings (replacing same keys)."""
    kept = [p for p in proto.metadata_props if p.key not in values]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    for key, value in values.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)


def load_proto(model: Path | bytes) -> Any:
    """An ONNX ModelProto from a file or bytes, or None when it is not one (onnxruntime then names the problem)."""
    try:
        import onnx

        return onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model)
    except Exception:  # (onnx raises DecodeError and others for a file that is not a model)
        return None


def is_int8(proto: Any) -> bool:
    """Whether an ONNX ModelProto is quantised: QDQ nodes (static) or onnxruntime's integer MatMuls (dynamic)."""
    return any(n.op_type in ("QuantizeLinear", "MatMulInteger", "DynamicQuantizeLinear") for n in proto.graph.node)


def onnx_metadata(meta: dict[str, str], path: str | os.PathLike) -> dict:
    """What `vit export` wrote into an ONNX model's metadata (`METADATA_KEYS`), read back from JSON."""

    missing = [k for k in METADATA_KEYS if k not in meta]
    if missing:
        raise UserValueError(f"{path}: the ONNX metadata lacks {', '.join(missing)}; "
                             "export the model with `vit export --format onnx`")
    try:
        return {k: json.loads(meta[k]) for k in METADATA_KEYS}
    except json.JSONDecodeError as e:
        raise UserValueError(f"{path}: ONNX metadata that is not JSON ({e})") from e
