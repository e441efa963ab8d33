"""`vit export`: ONNX checked by onnxruntime, safetensors that timm loads, atomic files, clear errors."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime
import pytest
import timm
import torch

import vit
from tests.conftest import umask
from tests.helpers import TINY_DIM
from vit.commands import main, run
from vit.deploy import export, load_classifier


def run_onnx(path, x: torch.Tensor) -> torch.Tensor:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])


def test_onnx_export_agrees_with_pytorch_at_any_batch_size(exported):
    classifier = load_classifier(exported.ckpt)
    assert sorted(p.name for p in exported.onnx.parent.iterdir()) == ["model.int8.onnx", "model.onnx"]  # no temp
    assert f"wrote {exported.onnx}: onnxruntime vs PyTorch" in exported.printed
    assert f"wrote {exported.onnx_int8}: onnxruntime vs PyTorch" in exported.printed
    proto = onnx.load(exported.onnx)
    onnx.checker.check_model(proto, full_check=True)
    assert proto.opset_import[0].version == export.OPSET
    batch_dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param and not batch_dim.dim_value  # a named, dynamic batch axis
    for batch in (1, 5):
        x = torch.randn(batch, 1, 16, 16)
        with torch.no_grad():
            expected = classifier(x)
        torch.testing.assert_close(run_onnx(exported.onnx, x), expected, atol=1e-4, rtol=0)


def test_int8_export_quantises_the_linear_layers_only(exported):
    def matmuls(path) -> dict[str, int]:
        graph = onnx.load(path).graph
        weights = {init.name for init in graph.initializer}
        kinds = [f"{n.op_type} {'weight' if n.input[1] in weights else 'activations'}" for n in graph.node
                 if n.op_type in ("MatMul", "MatMulInteger", "Gemm")]
        return {kind: kinds.count(kind) for kind in sorted(set(kinds))}

    # depth 1 (its cls-only block splits qkv into q and kv): q, kv, proj, fc1, fc2 become int8; the two
    # attention products (both operands activations) and the head stay fp32
    assert matmuls(exported.onnx) == {"Gemm weight": 1, "MatMul activations": 2, "MatMul weight": 5}
    assert matmuls(exported.onnx_int8) == {"MatMul activations": 2, "MatMul weight": 1, "MatMulInteger weight": 5}
    assert exported.onnx_int8.stat().st_size < exported.onnx.stat().st_size
    x = torch.randn(16, 1, 16, 16)
    torch.testing.assert_close(run_onnx(exported.onnx_int8, x), run_onnx(exported.onnx, x), atol=0.05, rtol=0)


def test_safetensors_export_loads_in_timm_and_back_in_vit(exported):
    classifier = load_classifier(exported.ckpt)
    folder = exported.safetensors
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == "vit_tiny_patch16_224"  # the closest timm name to our digits model
    assert config["num_classes"] == 10 and config["label_names"] == classifier.class_names
    assert config["model_args"] == {"img_size": 16, "patch_size": 4, "in_chans": 1, "embed_dim": TINY_DIM, "depth": 1,
                                    "num_heads": 2, "mlp_ratio": 2.0}
    x = torch.randn(3, 1, 16, 16)
    with torch.no_grad():
        expected = classifier(x)
        # timm's reader of the hub layout, and the explicit call with the file
        hub = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
        explicit = timm.create_model(
            config["architecture"], pretrained=True, num_classes=config["num_classes"], **config["model_args"],
            pretrained_cfg_overlay=dict(file=str(folder / "model.safetensors"), num_classes=config["num_classes"]),
        ).eval()
        torch.testing.assert_close(hub(x), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(explicit(x), expected, atol=1e-5, rtol=0)
    cfg = hub.pretrained_cfg
    assert (cfg["mean"], cfg["std"]) == (list(classifier.mean), list(classifier.std))
    assert (cfg["input_size"], cfg["crop_pct"], cfg["interpolation"]) == ((1, 16, 16), 1.0, "bilinear")
    assert cfg["label_names"] == classifier.class_names
    # timm's own data config builds the same evaluation transform as ours
    from PIL import Image

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 12), dtype=np.uint8))
    timm_transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=hub))
    torch.testing.assert_close(timm_transform(image.convert("L")), classifier.eval_transform()(image))

    # and back: our model from the same config, loaded by vit.load_pretrained (the folder or the file)
    for source in (folder, folder / "model.safetensors"):
        ours = vit.create_model(config["architecture"], num_classes=config["num_classes"], **config["model_args"])
        result = vit.load_pretrained(ours, source)
        assert not result.head_reset and not result.notes
        with torch.no_grad():
            torch.testing.assert_close(ours.eval()(x), expected, atol=0, rtol=0)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_exported_files_get_the_umasks_mode(fitted, tmp_path, mask):
    """Every file `vit export` writes is as readable as the umask says (0644 under 022), not mkstemp's 0600."""
    best = str(next((fitted / "ckpt").glob("best-*.ckpt")))
    with umask(mask) as expected:
        main(["export", "--ckpt", best, "--format", "onnx", "--out", str(tmp_path), "--quantize", "int8"])
        main(["export", "--ckpt", best, "--format", "safetensors", "--out", str(tmp_path)])
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()}  # every file written
    assert modes == dict.fromkeys(["config.json", "model.int8.onnx", "model.onnx", "model.safetensors"], oct(expected))


def test_export_errors_name_the_problem(fitted, tmp_path, capsys):
    best = str(next((fitted / "ckpt").glob("best-*.ckpt")))
    with pytest.raises(FileNotFoundError, match=r"missing\.ckpt"):
        run(["export", "--ckpt", str(tmp_path / "missing.ckpt"), "--format", "safetensors", "--out", "x"])
    translator = tmp_path / "translator.ckpt"
    torch.save({"vit": {"task": "translate"}, "state_dict": {}}, translator)
    with pytest.raises(ValueError, match=r"translator\.ckpt holds the Translator task .*, but the ImageClassifier"):
        run(["export", "--ckpt", str(translator), "--format", "onnx", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit):
        run(["export", "--ckpt", best, "--format", "tflite", "--out", "x"])
    assert "invalid choice: 'tflite'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(["export", "--ckpt", best, "--format", "safetensors", "--quantize", "int8", "--out", "x"])
    assert "--quantize and --opset apply to --format onnx only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_failed_exports_write_nothing_and_keep_the_old_files(exported, tmp_path, monkeypatch):
    classifier = load_classifier(exported.ckpt)
    # an ONNX file that disagrees with PyTorch is refused before anything is written
    monkeypatch.setattr(export, "onnx_bytes", lambda *args: exported.onnx.read_bytes())
    monkeypatch.setattr(export, "check_onnx", lambda model, c, path, **kw: export.OnnxCheck(path, 0.5, 1.0, 8))
    with pytest.raises(ValueError, match=r"max \|logit diff\| 5.00e-01.*above the tolerance 0.0001; nothing written"):
        export.export_onnx(classifier, tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()
    # a write that fails half-way leaves the previous file whole and no temporary file behind
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "model.safetensors").write_bytes(b"previous export")
    monkeypatch.setattr("safetensors.torch.save", lambda *args, **kwargs: "not bytes")
    with pytest.raises(TypeError):
        export.export_safetensors(classifier, tmp_path / "st")
    assert [p.name for p in (tmp_path / "st").iterdir()] == ["model.safetensors"]
    assert (tmp_path / "st" / "model.safetensors").read_bytes() == b"previous export"


@pytest.mark.parametrize(("fmt", "accepted"), [("onnx", True), ("safetensors", False)])
def test_export_int8_is_an_onnx_option_only(fmt, accepted, tmp_path):
    from vit.commands.export import parse_args

    argv = ["--ckpt", "m.ckpt", "--format", fmt, "--out", str(tmp_path / "out"), "--int8", "dynamic"]
    if accepted:
        assert parse_args(argv).int8 == "dynamic"
    else:
        with pytest.raises(SystemExit):
            parse_args(argv)
