"""Run a trained model without Lightning: rebuild it, pick an engine, export it, predict files.

    backends.py     `load_classifier`: a checkpoint or an .onnx file, on torch, torch-bf16/compile, onnxruntime
                    or OpenVINO; the one loader of a trained classifier
    auto.py         `--backend auto`: the candidates timed on a few images, checked against the reference, the
                    fastest kept and cached beside the file
    classifier.py   `Classifier` (the torch model and its input card, `ModelInput`); `read_classifier`, a
                    checkpoint rebuilt as that torch model
    inference.py    `OnnxClassifier`, autocast, the ranked records that predict and serve answer
    metadata.py     the input card as an export carries it: written and read back
    export.py       ONNX (checked by onnxruntime) and timm's safetensors folder
    quantize.py     int8 ONNX (static, calibrated; dynamic)
    fusion.py       onnxruntime's fused attention for an ONNX graph
    cpu.py          the CPU's instruction sets (bf16, VNNI, AMX) that decide engines and int8 ranges
    altstack.py     the thread's alternate signal stack, kept across OpenVINO's plugin load (it would dangle)
    image_files.py  image paths as a dataset whose unreadable files are rows, not crashes
    predict.py      `predict_files`: records for a list of files, and their CSV/JSON
    confidence.py   the temperature and the "unknown" score as they travel with a model, applied to answers
    calibration.py  fitting them on a classifier's own splits (`vit calibrate`, `vit fit --calibrate`)
    label_calibration.py  a temperature per class for a multi-label checkpoint
    zeroshot.py     a classifier scored on a labelled folder: top-1 and the confusion matrix (`vit zeroshot --eval`)
    hub.py          `vit export --format hub`: timm's folder for the Hugging Face Hub, and its upload
    card.py         that folder's model card, written from what the run knows

Nothing here imports Lightning or `vit.cli` (tests/test_layout.py walks the imports to prove it).
"""

from typing import Any

from vit._graveyard import moved_name
from vit.deploy.backends import BACKENDS, load_classifier
from vit.deploy.classifier import Classifier, ModelInput, read_classifier
from vit.deploy.inference import OnnxClassifier
from vit.deploy.predict import predict_files, write_predictions

__all__ = ["BACKENDS", "Classifier", "ModelInput", "OnnxClassifier", "load_classifier", "predict_files",
           "read_classifier", "write_predictions"]


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # 0.1's load_backend and load_model (vit/_graveyard.py)
