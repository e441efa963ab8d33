"""Ship a trained classifier: ONNX for a service, safetensors + config.json for timm users.

Both start from `vit.deploy.load_classifier` (the evaluated weights: the EMA copy when training
kept one) and carry what prediction needs besides the weights: the class names and how to prepare
an image (size, channels, mean/std, crop_pct, interpolation).

* ONNX (`export_onnx`): torch's ``torch.export``-based exporter (``dynamo=True``; it needs onnxscript),
  opset 18, a dynamic batch axis; the preparation goes into the model's ``metadata_props`` as JSON
  strings. Each file is run by onnxruntime against PyTorch on a sample batch before it is written.
  ``quantize="static"`` adds a calibrated QDQ int8 copy, ``"dynamic"`` a dynamically quantised one
  (`vit.deploy.quantize`).
* safetensors (`export_safetensors`): ``model.safetensors`` + ``config.json`` in timm's Hugging Face
  hub layout (architecture, num_classes, label_names, model_args, pretrained_cfg), loadable with
  ``timm.create_model("local-dir:DIR", pretrained=True)``.

Every file is written atomically (`vit.files.save_atomic`); nothing is written when a check fails.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vit.checkpoints.meta import label_meta
from vit.deploy.classifier import Classifier
from vit.deploy.confidence import METADATA_KEY, SCORE_OUTPUT, Answering
from vit.deploy.metadata import label_metadata, set_metadata
from vit.errors import MissingPackageError, UserValueError
from vit.files import save_atomic
from vit.nn.configs import MODEL_CONFIGS, ViTConfig, named_config
from vit.nn.vision import VisionTransformer

OPSET = 18  # SDPA decomposes to MatMul/Softmax, which onnxruntime fuses; opset 23's Attention op ran slower on CPU


INPUT_NAME, OUTPUT_NAME = "images", "logits"


ONNX_TOLERANCE = 1e-4  # max |logit difference| allowed between onnxruntime and PyTorch in fp32


# ViTConfig fields that are also timm's VisionTransformer arguments, and those timm has no argument for.
TIMM_ARGS = ("img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias",
             "class_token", "reg_tokens", "no_embed_class", "pos_embed", "init_values", "act_layer", "pre_norm",
             "global_pool", "final_norm", "fc_norm", "dynamic_img_size")


# What timm's Eva (its DINOv3 class) takes of them; its state dict has DeiT III's gamma_1/2 and q_bias/v_bias.
EVA_ARGS = {"img_size", "embed_dim", "depth", "num_heads", "mlp_ratio"}


NOT_TIMM_ARGS = ("norm_eps", "distilled", "rope", "rope_temperature", "shifted_patches", "locality_attention",
                 "proj_dim", "normalize_embedding")  # the last two: a zero-shot head (refused below)


def need_onnx() -> None:
    """A clear error when the optional ONNX packages are missing."""
    missing = [m for m in ("onnx", "onnxruntime", "onnxscript") if not _importable(m)]
    if missing:
        raise MissingPackageError(f"ONNX export needs {', '.join(missing)}: pip install 'vit[export]' "
                          "(or pip install onnx onnxruntime onnxscript)")


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ---- ONNX ------------------------------------------------------------------------------------
@dataclass
class OnnxCheck:
    """How an exported file agrees with PyTorch on the sample batch."""

    path: Path
    max_abs_diff: float
    top1_agreement: float  # fraction of the batch whose top class is the same
    batch_size: int

    def __str__(self) -> str:
        return (f"{self.path}: onnxruntime vs PyTorch on a batch of {self.batch_size}: max |logit diff| "
                f"{self.max_abs_diff:.2e}, same top-1 on {self.top1_agreement:.0%}")


def sample_batch(classifier: Classifier, batch_size: int, seed: int = 0) -> torch.Tensor:
    """Normalised-looking random images (B, C, H, W), the same for every call with the same seed."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, classifier.in_chans, *classifier.img_size, generator=generator)


def onnx_bytes(classifier: Classifier, opset: int = OPSET) -> bytes:
    """The classifier as a serialised ONNX model with a dynamic batch axis and the preprocessing metadata."""
    need_onnx()
    model, outputs = classifier.model.eval(), [OUTPUT_NAME]
    unknown = classifier.confidence.unknown if classifier.confidence is not None else None
    if unknown is not None:  # the unknown score as a second output, from the same forward pass
        model, outputs = Answering(model, unknown).eval(), [OUTPUT_NAME, SCORE_OUTPUT]
    # Traced with 2 images: batch 1 would let torch.export specialise the batch axis to a constant.
    example = sample_batch(classifier, 2)
    batch = torch.export.Dim("batch", min=1)
    with torch.no_grad():
        program = torch.onnx.export(
            model, (example,), dynamo=True, opset_version=opset, input_names=[INPUT_NAME],
            output_names=outputs, dynamic_shapes={"x": {0: batch}}, verbose=False,
        )
    proto = program.model_proto
    calibration = {METADATA_KEY: classifier.calibration.to_dict()} if classifier.calibration is not None else {}
    set_metadata(proto, classifier.card() | calibration | label_metadata(classifier.thresholds))
    return proto.SerializeToString()


def check_onnx(model: bytes, classifier: Classifier, path: Path, batch_size: int = 8,
               images: torch.Tensor | None = None) -> OnnxCheck:
    """Run ``model`` with onnxruntime and PyTorch on the same batch: ``images``, or a random sample batch
    (not the traced batch size)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = sample_batch(classifier, batch_size, seed=1) if images is None else images.float()
    with torch.no_grad():
        expected = classifier(x).float()
    got = torch.from_numpy(session.run(None, {INPUT_NAME: x.numpy()})[0])
    if got.shape != expected.shape:
        raise ValueError(f"{path}: onnxruntime returned logits of shape {tuple(got.shape)}, "
                         f"PyTorch {tuple(expected.shape)}")
    same = (got.argmax(-1) == expected.argmax(-1)).float().mean().item()
    return OnnxCheck(path, (got - expected).abs().max().item(), same, len(x))


def exact_onnx(classifier: Classifier, opset: int = OPSET) -> bytes:
    """The classifier as fp32 ONNX bytes, checked by onnxruntime against PyTorch to `ONNX_TOLERANCE`."""
    classifier = classifier.cpu().eval()
    fp32 = onnx_bytes(classifier, opset)
    check = check_onnx(fp32, classifier, Path("model.onnx"))
    if not check.max_abs_diff <= ONNX_TOLERANCE:
        raise ValueError(f"{check}: above the tolerance {ONNX_TOLERANCE}")
    return fp32


def export_onnx(
    classifier: Classifier, out_dir: str | os.PathLike, *, quantize: str | None = None, opset: int = OPSET,
    name: str = "model", calibration: torch.Tensor | None = None, reduce_range: bool | None = None,
) -> list[OnnxCheck]:
    """Write ``out_dir/model.onnx`` (and ``model.int8.onnx`` with ``quantize``), each checked first.

    ``quantize``: "static" (calibrated on ``calibration``, images (N, C, H, W) through the eval transform;
    ``reduce_range`` None: chosen by this CPU, `vit.deploy.cpu.reduce_range_for`), "dynamic", or "int8" (the old
    name of "dynamic"). Raises ``ValueError`` without writing anything if the fp32 export differs from
    PyTorch by more than `ONNX_TOLERANCE`. The int8 file is checked and reported, not held to that tolerance;
    a static one also on the calibration images (`OnnxCheck` of those).
    """
    from vit.deploy.quantize import quantize_dynamic_int8, quantize_static_int8

    if quantize not in (None, "int8", "dynamic", "static"):
        raise UserValueError(f"quantize must be None, 'static' or 'dynamic', got {quantize!r}")
    if quantize == "static" and calibration is None:
        raise UserValueError("static int8 needs calibration images (--calibration FOLDER or CONFIG)")
    classifier = classifier.cpu().eval()
    out_dir = Path(out_dir)
    fp32 = onnx_bytes(classifier, opset)
    path = out_dir / f"{name}.onnx"
    check = check_onnx(fp32, classifier, path)
    if not check.max_abs_diff <= ONNX_TOLERANCE:
        raise ValueError(f"{check}: above the tolerance {ONNX_TOLERANCE}; nothing written")
    files = [(path, fp32, check)]
    int8_path = out_dir / f"{name}.int8.onnx"
    if quantize in ("int8", "dynamic"):
        int8 = quantize_dynamic_int8(fp32)
        files.append((int8_path, int8, check_onnx(int8, classifier, int8_path)))
    elif quantize == "static":
        from vit.deploy.cpu import reduce_range_for

        reduce_range = reduce_range_for() if reduce_range is None else reduce_range
        int8 = quantize_static_int8(fp32, calibration, reduce_range=reduce_range)
        files.append((int8_path, int8, check_onnx(int8, classifier, int8_path, images=calibration)))
    for target, data, _ in files:
        save_atomic(lambda f, data=data: f.write(data), target)
    return [c for _, _, c in files]


# ---- safetensors + timm config ---------------------------------------------------------------
def _arch_args(config: ViTConfig) -> dict[str, Any]:
    """The weight- and forward-shaping fields of a config, JSON-friendly (a square size as one int, like timm)."""
    values = config.to_dict()
    args = {k: values[k] for k in TIMM_ARGS + NOT_TIMM_ARGS}
    for key in ("img_size", "patch_size"):
        size = args[key]
        if not isinstance(size, int):
            size = [int(s) for s in size]
            args[key] = size[0] if size[0] == size[1] else size
    return args


def timm_architecture(model_name: str, model: VisionTransformer) -> tuple[str, dict[str, Any]]:
    """A timm architecture name and the ``model_args`` that turn it into ``model``, from ``model.config``.

    Our name when timm knows it; otherwise (e.g. the digits models) the timm-named config that needs
    the fewest overrides, then the closest width. ``model_args`` holds only what differs from it.
    """
    import timm

    extras = [k for k in ("shifted_patches", "locality_attention") if getattr(model.config, k)]
    extras += ["global_pool='token_avg'"] if model.config.global_pool == "token_avg" else []
    if model.config.proj_dim or model.config.normalize_embedding:  # a zero-shot head scores a cosine: not linear
        extras.append("normalised CLIP embedding (a vit zeroshot head)" if model.config.normalize_embedding
                      else "CLIP projection (proj_dim)")
    if extras:
        raise UserValueError(
            f"timm's VisionTransformer has no {' or '.join(extras)}, so these weights cannot be shipped as a "
            "timm model; export to ONNX instead (vit export --format onnx)"
        )
    ours = _arch_args(model.config)

    def overrides(name: str) -> dict[str, Any]:
        theirs = _arch_args(named_config(name))  # once per name, not an asdict per key
        return {k: v for k, v in ours.items() if theirs[k] != v}

    candidates = [n for n in MODEL_CONFIGS if timm.is_model(n) and not set(overrides(n)) & set(NOT_TIMM_ARGS)]
    if model_name in candidates:
        return model_name, overrides(model_name)
    if not candidates:
        raise UserValueError(f"no timm architecture matches this model's {', '.join(NOT_TIMM_ARGS)}; "
                             "export to ONNX instead (vit export --format onnx)")
    best = min(candidates, key=lambda n: (len(overrides(n)), abs(MODEL_CONFIGS[n]["embed_dim"] - ours["embed_dim"])))
    return best, overrides(best)


def timm_config(classifier: Classifier) -> dict[str, Any]:
    """``config.json`` in timm's Hugging Face hub layout for the classifier's weights: a ViT's timm architecture,
    or a timm convnet's (teacher_small's) own name and ``timm.create_model`` arguments, as they were."""
    model = classifier.model
    if classifier.is_vit:
        architecture, model_args = timm_architecture(classifier.model_name, model)
        if model.config.rope is not None and (architecture != classifier.model_name or set(model_args) - EVA_ARGS):
            raise UserValueError(f"timm builds DINOv3 with its Eva class, which takes {', '.join(sorted(EVA_ARGS))} "
                                 f"but not {', '.join(sorted(set(model_args) - EVA_ARGS)) or 'this model'}: export "
                                 "to ONNX instead (vit export --format onnx)")
        pool = {"global_pool": model.global_pool}
        fixed_size, first_conv, head = not model.dynamic_img_size, "patch_embed.proj", "head"
    else:
        architecture = classifier.model_name
        model_args = {k: v for k, v in (classifier.timm_args or {}).items() if k != "num_classes"}
        pool = {}
        fixed_size, first_conv, head = False, model.pretrained_cfg["first_conv"], model.pretrained_cfg["classifier"]
    config: dict[str, Any] = {
        "architecture": architecture,
        "num_classes": model.num_classes,
        "num_features": model.num_features,
        **pool,
        "label_names": list(classifier.class_names),
    }
    config.update(label_meta(classifier.thresholds))  # a multi-label model's flag and cuts; nothing for one label
    if model_args:
        config["model_args"] = model_args
    config["pretrained_cfg"] = {  # timm's names; `vit.preprocessing` reads it back from a hub folder
        "input_size": [classifier.in_chans, *classifier.img_size],
        "fixed_input_size": fixed_size,
        **classifier.preprocessing.to_dict(),  # interpolation, crop_pct, mean, std
        "crop_mode": "center",
        "num_classes": model.num_classes,
        "pool_size": None,
        "first_conv": first_conv,  # the stem and the head, by their names in the state dict
        "classifier": head,
    }
    return config


def timm_files(classifier: Classifier) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``config.json``'s content and the state dict in timm's names: what `export_safetensors` writes."""
    config = timm_config(classifier)  # first: it refuses what timm cannot build
    state = {k: v.detach().cpu().contiguous() for k, v in classifier.model.state_dict().items()}
    if classifier.is_vit and classifier.model.config.rope is not None:
        state = eva_names(state)
    return config, state


def write_timm_files(config: dict[str, Any], state: dict[str, torch.Tensor], out_dir: str | os.PathLike) -> list[Path]:
    """Write ``out_dir/model.safetensors`` and ``out_dir/config.json``, each atomically."""
    from safetensors.torch import save

    out_dir = Path(out_dir)
    text = json.dumps(config, indent=2).encode()
    data = save(state, metadata={"format": "pt"})
    weights = save_atomic(lambda f: f.write(data), out_dir / "model.safetensors")
    return [weights, save_atomic(lambda f: f.write(text), out_dir / "config.json")]


def export_safetensors(classifier: Classifier, out_dir: str | os.PathLike) -> list[Path]:
    """Write ``out_dir/model.safetensors`` (timm's state-dict names) and ``out_dir/config.json``."""
    return write_timm_files(*timm_files(classifier), out_dir)


def eva_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our DINOv3 weights in timm Eva's names: ``ls1/2.gamma`` -> ``gamma_1/2``; a ``qkv.bias`` (the ``_qkvb``
    models) -> ``q_bias`` and ``v_bias``. Its key third is dropped, which is exact: a key bias adds q.b to all of a
    query's scores alike, and softmax ignores that (the inverse of `vit.checkpoints.convert.convert_layer_scale`)."""
    out = {}
    for key, value in state.items():
        if key.endswith("attn.qkv.bias"):
            q, _, v = value.chunk(3)
            out[key.replace("qkv.bias", "q_bias")], out[key.replace("qkv.bias", "v_bias")] = q, v
            continue
        out[re.sub(r"^(blocks\.\d+\.)ls([12])\.gamma$", r"\1gamma_\2", key)] = value
    return out
