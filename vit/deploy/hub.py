"""`vit export --format hub`: a folder the Hugging Face Hub, timm and transformers all read, and its upload.

    DIR/config.json        timm's layout (architecture, num_classes, label_names, model_args, pretrained_cfg),
                           and a calibrated model's "calibration": {"temperature": T, "tta": ...}
    DIR/model.safetensors  as `vit export --format safetensors` writes them (`vit.deploy.export.timm_files`)
    DIR/README.md          the model card (`vit.deploy.card`)
    DIR/confusion_matrix.png   the run's, when the card reports its test accuracy

``timm.create_model("local-dir:DIR" or "hf-hub:owner/name", pretrained=True)``,
``transformers.AutoModelForImageClassification.from_pretrained`` and ``pipeline("image-classification")`` (its
TimmWrapper reads ``label_names``) load it. A grayscale model's patch embedding is written for RGB input, the
luma weighted in (`rgb_from_gray`): pipelines and the Hub's widget hand a model RGB images.
`push_folder` uploads the folder with huggingface_hub (``create_repo`` + ``upload_folder``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from vit.deploy.card import RunFacts, model_card
from vit.deploy.classifier import CALIBRATION_KEY, Classifier
from vit.deploy.confidence import Calibration
from vit.deploy.export import timm_files, write_timm_files
from vit.errors import UserValueError
from vit.files import save_atomic

LUMA = (0.299, 0.587, 0.114)  # PIL's convert("L") (ITU-R 601-2): what `vit predict` does to an RGB file first


class HubUploadError(UserValueError):
    """The folder was written but could not be uploaded (offline, no token, refused)."""


def rgb_from_gray(config: dict[str, Any], state: dict[str, torch.Tensor]) -> None:
    """Turn a 1-channel model's timm files into a 3-channel model that takes RGB and sees its luma, in place.

    The first conv's weight w (D, 1, kh, kw) becomes (w·0.299, w·0.587, w·0.114) and mean/std repeat per channel:
    on normalised channels x_c = (v_c - m)/s, Σ_c a_c·w·x_c = w·(Σ_c a_c·v_c - m)/s since Σ a_c = 1, so a gray
    image (R = G = B) gives the 1-channel model's logits, and a colour one its luma's (up to PIL's rounding)."""
    cfg = config["pretrained_cfg"]
    key = f"{cfg['first_conv']}.weight"
    weight = state[key]
    state[key] = torch.cat([weight * c for c in LUMA], dim=1).contiguous()
    cfg["input_size"] = [3, *cfg["input_size"][1:]]
    cfg["mean"], cfg["std"] = list(cfg["mean"]) * 3, list(cfg["std"]) * 3
    config.setdefault("model_args", {})["in_chans"] = 3


def hub_calibration(calibration: Calibration) -> dict[str, Any]:
    """What of a calibration a hub folder can apply: T (a T per class with its moved cuts, multi-label) and the TTA.
    Not the unknown score, which timm's weights cannot compute."""
    keep = {"temperature": calibration.temperature, "tta": calibration.tta}
    return keep | ({"thresholds": calibration.thresholds} if calibration.thresholds is not None else {})


def export_hub(classifier: Classifier, facts: RunFacts, out_dir: str | os.PathLike, name: str | None = None
               ) -> list[Path]:
    """Write the hub folder of ``classifier`` (model card from ``facts``) to ``out_dir``; ``name``: the repository
    id the card's examples use (default: the folder's name). Returns the files written."""
    out_dir = Path(out_dir)
    config, state = timm_files(classifier)
    if classifier.calibration is not None:  # timm and transformers ignore the key; `vit predict` on the folder reads it
        config[CALIBRATION_KEY] = hub_calibration(classifier.calibration)
    gray = classifier.in_chans == 1
    if gray:
        rgb_from_gray(config, state)
    files = write_timm_files(config, state, out_dir)
    text = model_card(classifier, facts, config["architecture"], (name or out_dir.resolve().name).split("/")[-1],
                      repo_id=name, rgb_from_gray=gray, model_args=config.get("model_args"))
    files.append(save_atomic(lambda f: f.write(text.encode()), out_dir / "README.md"))
    if facts.confusion is not None:
        files.append(Path(shutil.copyfile(facts.confusion, out_dir / "confusion_matrix.png")))
    return files


def _offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def push_folder(folder: str | os.PathLike, repo_id: str, *, private: bool = False, revision: str | None = None,
                commit_message: str | None = None) -> str:
    """Upload ``folder`` to the model repository ``repo_id`` (created if missing; ``revision``: a branch, created
    from main if missing) with the token from the usual places (HF_TOKEN, `hf auth login`). Returns the commit's
    URL; raises `HubUploadError` in one line naming the folder, which can be uploaded later."""
    from huggingface_hub import HfApi, get_token

    later = f"{folder} is written; upload it later with `hf upload {repo_id} {folder}`"
    if _offline():
        raise HubUploadError(f"cannot push to {repo_id}: HF_HUB_OFFLINE is set. {later}")
    if get_token() is None:
        raise HubUploadError(f"cannot push to {repo_id}: no Hugging Face token (set HF_TOKEN or run `hf auth "
                             f"login`). {later}")
    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, folder_path=str(folder), revision=revision,
                                   commit_message=commit_message or f"vit export --format hub: {Path(folder).name}")
    except Exception as e:  # network, token, permissions: each a different exception, one advice
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise HubUploadError(f"cannot push to {repo_id} ({type(e).__name__}: {reason[:200]}). {later}") from e
    return commit.commit_url
