"""Run a trained model without Lightning: rebuild it, pick an engine, export it, predict files.

    classifier.py   `Classifier` and `load_classifier`: a `vit fit` checkpoint as a ready torch model
    inference.py    `OnnxClassifier`, `load_model` (a checkpoint or an .onnx file), autocast, ranked records
    backends.py     `load_backend`: the same model on torch, torch-bf16/compile, onnxruntime or OpenVINO
    metadata.py     the keys an export carries (classes, preparation), written and read back
    export.py       ONNX (checked by onnxruntime) and timm's safetensors folder
    quantize.py     int8 ONNX (static, calibrated; dynamic)
    fusion.py       onnxruntime's fused attention for an ONNX graph
    cpu.py          the CPU's instruction sets (bf16, VNNI, AMX) that decide engines and int8 ranges
    image_files.py  image paths as a dataset whose unreadable files are rows, not crashes
    predict.py      `predict_files`: records for a list of files, and their CSV/JSON

Nothing here imports Lightning or `vit.cli` (tests/deploy/test_imports.py walks the imports to prove it).
"""

from vit.deploy.backends import BACKENDS, load_backend
from vit.deploy.classifier import Classifier, load_classifier
from vit.deploy.inference import OnnxClassifier, load_model
from vit.deploy.predict import predict_files, write_predictions

__all__ = ["BACKENDS", "Classifier", "OnnxClassifier", "load_backend", "load_classifier", "load_model",
           "predict_files", "write_predictions"]
