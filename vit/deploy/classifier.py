"""A trained classifier without Lightning: the evaluated network and what it takes to prepare its input.

`read_classifier(path)` rebuilds it from a `vit fit` checkpoint alone (`vit.checkpoints.meta` says what the
file holds): the EMA weights when training kept them, the class names, the size, mean/std, crop and
interpolation the test split used.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch
from torch import Tensor, nn

from vit.checkpoints.io import read_checkpoint
from vit.checkpoints.meta import evaluated_weights, expect_task, label_thresholds
from vit.checkpoints.weights import load_merged, load_pretrained
from vit.deploy.confidence import CHECKPOINT_KEY, Calibration, Confidence, layer_features
from vit.errors import UserValueError
from vit.nn.vision import VisionTransformer, build_model
from vit.preprocessing import PREPROCESSING_KEYS, Prepared, Preprocessing, eval_short_side

# ---- the input card ------------------------------------------------------------------------------
CARD_KEYS = ("model_name", "class_names", "img_size", "in_chans", *PREPROCESSING_KEYS)
CALIBRATION_KEY = "calibration"  # a hub folder's config.json: T and the TTA (`vit.deploy.hub.hub_calibration`)


class ModelInput(Prepared):
    """The input card of a model that runs, and the one owner of how an image is read for it: the decoding mode,
    the evaluation resize and transform, and the card as plain data (what `vit export` writes into an ONNX file,
    what `vit serve`'s /info shows, what the ONNX and OpenVINO runners read back with `set_card`).

    Holders set ``model_name``, ``class_names``, ``img_size`` (H, W), ``in_chans`` and ``preprocessing``.
    """

    model_name: str
    class_names: list[str]
    img_size: tuple[int, int]
    in_chans: int

    @property
    def image_mode(self) -> str:
        """The PIL mode a file is decoded to: "L" for a 1-channel model, else "RGB"."""
        return "L" if self.in_chans == 1 else "RGB"

    def eval_short_side(self, crop_pct: float | None = None) -> int:
        """The side the evaluation resize gives the image's short side (before the centre crop)."""
        return eval_short_side(self.img_size, self.crop_pct if crop_pct is None else crop_pct)

    def eval_transform(self, crop_pct: float | None = None) -> Callable:
        """The transform the test split went through: resize, centre crop, normalise."""
        from vit.data.transforms import eval_transform

        return eval_transform(self.in_chans, self.img_size, self.crop_pct if crop_pct is None else crop_pct,
                              self.interpolation, self.mean, self.std)

    def card(self) -> dict[str, Any]:
        """The name, classes and input preparation as plain JSON-able values (`CARD_KEYS`)."""
        return {"model_name": self.model_name, "class_names": list(self.class_names),
                "img_size": list(self.img_size), "in_chans": self.in_chans, **self.preprocessing.to_dict()}

    def set_card(self, values: dict[str, Any]) -> None:
        """Take the card from plain values (an export's metadata, read back)."""
        self.model_name, self.class_names = values["model_name"], list(values["class_names"])
        self.img_size, self.in_chans = tuple(values["img_size"]), int(values["in_chans"])
        self.preprocessing = Preprocessing.from_dict(values)


def is_multi_label(model: Any) -> bool:
    """Whether a loaded model (a `Classifier`, an ONNX or OpenVINO runner, or a wrapper of one) answers several labels
    per image, a sigmoid per class cut at its ``thresholds``, rather than one by softmax. The one test of the label
    kind once a model is loaded: each file stores it its way (`vit.checkpoints.meta.label_thresholds`,
    `vit.deploy.metadata.exported_thresholds`) and each loader sets ``thresholds`` from it."""
    return getattr(model, "thresholds", None) is not None


# ---- a trained classifier, without Lightning --------------------------------------------------
class Classifier(ModelInput, nn.Module):
    """A trained ViT (or a timm convnet `vit fit` trained as a teacher) with what it takes to prepare its input and
    name its output.

    ``.model`` holds the evaluated weights (the EMA weights when training used EMA); ``.class_names``,
    ``.img_size`` (H, W), ``.in_chans``, ``.mean``, ``.std``, ``.crop_pct`` and ``.interpolation``
    say how images were prepared for testing, and so how to prepare them for prediction.
    """

    def __init__(
        self, model: VisionTransformer | nn.Module, *, model_name: str, class_names: Sequence[str],
        mean: Sequence[float], std: Sequence[float], crop_pct: float, interpolation: str,
        img_size: int | None = None, timm_args: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if len(class_names) != model.num_classes:
            raise UserValueError(f"{len(class_names)} class names for a {model.num_classes}-class model")
        self.model = model
        self.model_name = model_name
        self.class_names = list(class_names)
        self.preprocessing = Preprocessing(mean, std, crop_pct, interpolation)  # read as .mean, .std, ...
        self.input_size = (img_size, img_size) if img_size is not None else None  # a convnet's: it has no img_size
        self.timm_args = timm_args  # a convnet's timm.create_model arguments (None for our ViTs, which hold a config)
        self.confidence: Confidence | None = None  # the temperature and unknown score `vit calibrate` fit
        self.thresholds: list[float] | None = None  # a multi-label model's cut per class (chosen on val)

    @property
    def img_size(self) -> tuple[int, int]:
        """(height, width) the model expects."""
        return self.input_size or self.model.img_size

    @property
    def in_chans(self) -> int:
        """Number of input channels the model expects."""
        return self.model.in_chans

    @property
    def is_vit(self) -> bool:
        """Whether the network is one of our ViTs (attention maps, rollout), not a timm convnet (teacher_small's)."""
        return isinstance(self.model, VisionTransformer)

    def require_vit(self, what: str, path: str | os.PathLike) -> None:
        """A clear error when ``what`` (a ViT-only feature) is asked of a convnet checkpoint."""
        if not self.is_vit:
            raise UserValueError(f"{path} holds timm's {self.model_name}, a convnet (as configs/teacher_small.yaml "
                                 f"trains), and {what} need a ViT's attention. vit predict, vit export and vit serve "
                                 "read this checkpoint; give a ViT checkpoint here (e.g. the distilled student's)")

    @property
    def device(self) -> torch.device:
        """Where the weights are (of any network: a teacher_small convnet has no patch embedding)."""
        return next(self.model.parameters()).device

    def forward(self, x: Tensor) -> Tensor:
        """Logits (B, num_classes)."""
        return self.model(x)

    @property
    def calibration(self) -> Calibration | None:
        """The temperature and threshold to answer with; None for a checkpoint never calibrated."""
        return self.confidence.calibration if self.confidence is not None else None

    def answer(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """Logits (B, num_classes) and the unknown score (B,), from one forward pass; None: no score was fit."""
        if self.confidence is None or self.confidence.unknown is None:
            return self(x), None
        features, logits = layer_features(self.model, x)
        unknown = self.confidence.unknown.to(logits.device)
        return logits, unknown(features[-len(unknown.layers):])[0]


def is_hub_model(path: str | os.PathLike) -> bool:
    """A shared model (``hf-hub:owner/name``) or a timm hub folder (config.json and weights), not a checkpoint."""
    from pathlib import Path

    return str(path).startswith("hf-hub:") or (Path(path).is_dir() and (Path(path) / "config.json").is_file())


def read_hub_classifier(source: str | os.PathLike, device: str | torch.device = "cpu") -> Classifier:
    """A model in timm's hub layout (`vit export --format hub`, from a folder or ``hf-hub:owner/name`` through the
    Hugging Face cache) as a `Classifier`: its architecture and ``model_args``, its weights, ``label_names`` and
    ``pretrained_cfg``."""
    import json
    from pathlib import Path

    from vit.checkpoints.hub import hub_folder
    from vit.checkpoints.weights import read_state_dict
    from vit.nn.configs import MODEL_CONFIGS
    from vit.nn.vision import create_model

    folder = hub_folder(str(source)) if str(source).startswith("hf-hub:") else Path(source)
    config = json.loads((folder / "config.json").read_text())
    cfg, args, n = config["pretrained_cfg"], dict(config.get("model_args") or {}), int(config["num_classes"])
    if config["architecture"] in MODEL_CONFIGS:  # one of our ViTs, by its timm name
        pool = {"global_pool": config["global_pool"]} if "global_pool" in config else {}
        model = create_model(config["architecture"], **{**args, **pool, "num_classes": n})
        load_pretrained(model, folder)
        img_size = None
    else:  # a timm network (a convnet `vit fit` trained as a teacher)
        import timm

        model = timm.create_model(config["architecture"], **{**args, "num_classes": n})
        model.load_state_dict(read_state_dict(folder))
        model.in_chans, img_size = int(cfg["input_size"][0]), int(cfg["input_size"][-1])
    names = config.get("label_names") or [str(i) for i in range(n)]
    classifier = Classifier(model, model_name=config["architecture"], class_names=names, img_size=img_size,
                            **asdict(Preprocessing.from_dict(cfg)))
    classifier.thresholds = label_thresholds(config)
    if config.get(CALIBRATION_KEY):  # T (and the TTA) `vit export --format hub` carried: answers as the checkpoint's
        classifier.confidence = Confidence(Calibration.from_dict(config[CALIBRATION_KEY]))
    return classifier.to(device).eval()


def read_classifier(path: str | os.PathLike, device: str | torch.device = "cpu") -> Classifier:
    """A `vit fit` checkpoint as a torch `Classifier`, rebuilt from the file alone, in eval mode (what
    `vit.deploy.load_classifier` does for a checkpoint, for the commands that need the torch model itself).
    A model in timm's hub layout (`is_hub_model`) is read by `read_hub_classifier`."""
    if is_hub_model(path):
        return read_hub_classifier(path, device)
    return checkpoint_classifier(read_checkpoint(path), path, device)


def checkpoint_classifier(checkpoint: dict[str, Any], path: str | os.PathLike,
                          device: str | torch.device = "cpu") -> Classifier:
    """`read_classifier` of a checkpoint read already (``path`` names it in errors): for a caller that writes it back
    (`vit.deploy.calibration.calibrate_checkpoint`), so the file is read once."""
    meta = expect_task(checkpoint, "classify", path)
    if meta.get("model_source") == "timm":  # a timm network `vit fit` trained (backbone: timm)
        import timm

        model = timm.create_model(meta["model_name"], **meta["model_config"])
        model.in_chans = meta["model_config"]["in_chans"]
        timm_args = dict(meta["model_config"])
    else:
        model, timm_args = build_model(meta["model_config"]), None
    weights = evaluated_weights(checkpoint["state_dict"], meta["ema"])
    if meta.get("lora"):  # adapters (finetune: Adapters): merged into plain weights, the base found first
        load_merged(model, weights, meta["lora"], path)
    else:
        model.load_state_dict(weights)
    classifier = Classifier(model, model_name=meta["model_name"], class_names=meta["class_names"],
                            img_size=meta.get("img_size"), timm_args=timm_args, **asdict(Preprocessing.from_dict(meta)))
    classifier.thresholds = label_thresholds(meta)
    if checkpoint.get(CHECKPOINT_KEY):
        classifier.confidence = Confidence.from_checkpoint(checkpoint[CHECKPOINT_KEY])
    return classifier.to(device).eval()
