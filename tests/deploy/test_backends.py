"""Inference backends (`vit.deploy.backends`, `vit.deploy.quantize`, `vit.deploy.fusion`): every backend against eager
fp32 on a trained digits model, the calibrated int8 file's structure, the instruction-set choices (mocked) and the
fused attention."""

from __future__ import annotations

import contextlib
import io
import json
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import vit.deploy.cpu
from tests import CONFIGS
from vit.commands import main, run
from vit.deploy import backends, load_classifier
from vit.deploy.backends import UnsupportedBackendError
from vit.deploy.fusion import attention_nodes, fuse_attention
from vit.deploy.quantize import quantize_static_int8
from vit.errors import MissingPackageError

CONFIG = CONFIGS / "digits.yaml"
NO_VNNI = frozenset({"avx2", "avx512f", "fma"})  # an AVX-512 CPU of before Cascade Lake, or AMD Zen 2/3
VNNI = frozenset({"avx2", "avx512f", "avx512_vnni"})
AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8"})
ZEN4 = frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"})  # AMD EPYC Genoa: bf16 dot products, no AMX
AVX_VNNI = frozenset({"avx2", "avx_vnni"})  # Intel Alder/Arrow Lake: 256-bit VNNI, no AVX-512


@pytest.fixture(scope="module")
def trained(digits_run, tmp_path_factory):
    """The trained digits checkpoint, exported once by the command with static int8 calibrated on its config's
    training split; and the digits test split as the DataModule prepares it."""
    from vit.data import Digits

    out = tmp_path_factory.mktemp("backends")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(["export", "--ckpt", str(digits_run.best), "--format", "onnx", "--out", str(out), "--int8", "static",
              "--calibration", str(CONFIG)])
    data = Digits(img_size=16)
    data.setup("test")
    images, labels = zip(*(data.test_set[i] for i in range(len(data.test_set))))
    return dict(ckpt=digits_run.best, fp32=out / "model.onnx", int8=out / "model.int8.onnx", printed=printed.getvalue(),
                images=torch.stack(images), labels=torch.as_tensor(labels))


INT8_LOGIT_TOL = 0.4  # calibrated: 0.14-0.2 on the digits (its logits span about 20); calibrated on zeros: 0.8


def logits(model, images: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(images[i:i + 64]).float() for i in range(0, len(images), 64)])


def agrees(got: torch.Tensor, eager: torch.Tensor, exact: bool) -> bool:
    """The agreement bar: exact backends within 1e-4; bf16 and int8 the same top-1 on >= 99% of the images, int8
    within `INT8_LOGIT_TOL` (top-1 alone passed a model calibrated on zeros: the digits model is too sure)."""
    diff = (got - eager).abs().max().item()
    same = (got.argmax(-1) == eager.argmax(-1)).float().mean().item()
    print(f"max |diff| {diff:.3g}, same top-1 {same:.4f}")
    return diff <= (1e-4 if exact else INT8_LOGIT_TOL) and same >= 0.99


def test_every_backend_agrees_with_eager_fp32_on_the_trained_model(trained):
    """Exact backends within 1e-4; bf16 and int8: the same top-1 on >= 99% of the 359 test digits and a test
    accuracy within one point (3 of 359 images)."""
    eager = logits(load_classifier(trained["ckpt"]), trained["images"])
    accuracy = (eager.argmax(-1) == trained["labels"]).float().mean().item()
    assert accuracy > 0.85  # a model that learnt, so agreement means something
    runs = {"onnx": trained["ckpt"], "openvino": trained["fp32"], "onnx-int8": trained["int8"],
            "openvino-int8": trained["int8"]}
    if vit.deploy.cpu.has_native_bf16():
        runs["torch-bf16"] = trained["ckpt"]
    for backend, path in runs.items():
        model = load_classifier(path, backend=backend, threads=1)
        assert model.backend == backend
        got = logits(model, trained["images"])
        got_accuracy = (got.argmax(-1) == trained["labels"]).float().mean().item()
        assert agrees(got, eager, exact=backend in backends.EXACT), backend
        assert abs(got_accuracy - accuracy) <= 0.01, (backend, got_accuracy, accuracy)


def test_compiled_backend_gives_eager_logits():
    """torch-compile's frozen Inductor graph on a tiny model (its default mode: max-autotune takes a minute)."""
    import vit as vit_package
    from vit.deploy.classifier import Classifier

    model = vit_package.create_model("vit_digits_patch4_16", num_classes=3, depth=1, embed_dim=32, num_heads=2)
    classifier = Classifier(model.eval(), model_name="tiny", class_names=["a", "b", "c"], mean=(0.5,), std=(0.5,),
                            crop_pct=1.0, interpolation="bilinear")
    x = torch.randn(4, 1, 16, 16)
    compiled = backends.CompiledClassifier(classifier, mode="default")
    torch.testing.assert_close(compiled(x), classifier(x), atol=1e-4, rtol=0)
    torch.testing.assert_close(compiled(x[:3]), classifier(x[:3]), atol=1e-4, rtol=0)  # a last, smaller batch
    assert compiled.sizes == {4}  # padded to the compiled size: no second compile
    assert compiled.class_names == ["a", "b", "c"] and compiled.backend == "torch-compile"


def test_broken_calibration_loses_the_agreement(trained):
    """A model calibrated on zeros fails the agreement the test above checks (it kept top-1 on 99.7% of the digits:
    LayerNorm gives the quantised layers inputs of a realistic scale even then, but the logits move 0.8)."""
    classifier = load_classifier(trained["ckpt"])
    eager = logits(classifier, trained["images"])
    broken = quantize_static_int8(onnx.load(trained["fp32"]).SerializeToString(), torch.zeros(32, 1, 16, 16),
                                  reduce_range=False)
    got = logits(backends.OnnxClassifier(broken, 1), trained["images"])
    assert not agrees(got, eager, exact=False)


def metadata(path) -> dict:
    """Our metadata entries of an ONNX file (JSON), without the quantiser's own."""
    return {p.key: json.loads(p.value) for p in onnx.load(path).metadata_props
            if p.key in ("quantization", "class_names")}


def producers(graph) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output}


def test_static_int8_quantises_the_linear_layers_and_keeps_the_rest_fp32(trained):
    graph = onnx.load(trained["int8"]).graph
    made_by = producers(graph)
    weights = {init.name for init in graph.initializer}

    def dequantized(name: str) -> bool:  # fed by DequantizeLinear (of an activation, or of an int8 weight)
        return name in made_by and made_by[name].op_type == "DequantizeLinear"

    kinds: dict[str, list[bool]] = {}
    for node in graph.node:
        if node.op_type in ("MatMul", "Conv", "Gemm", "Softmax"):
            weight = made_by.get(node.input[1]) if len(node.input) > 1 else None
            linear = node.op_type == "MatMul" and weight is not None and weight.input[0] in weights
            kind = "linear" if linear else f"{node.op_type}{' activations' if node.op_type == 'MatMul' else ''}"
            kinds.setdefault(kind, []).append(all(dequantized(i) for i in node.input[:2]))
    # digits model, depth 4: 15 Linear layers (qkv, proj, fc1, fc2 of the first three blocks; proj, fc1, fc2 of the
    # last) int8. fp32: the patch embedding, the head, softmax, two attention products a block, and the last
    # block's q and kv: it computes the cls query alone, and the exporter leaves their weights as a Transpose of
    # a Slice of its qkv weight, which is not an initializer the quantiser sees (a 1-token q, one kv of 4 blocks)
    assert kinds == {"linear": [True] * 15, "MatMul activations": [False] * 10, "Conv": [False], "Gemm": [False],
                     "Softmax": [False] * 4}
    meta = metadata(trained["int8"])
    assert meta["quantization"]["mode"] == "static" and meta["quantization"]["calibration_images"] == 300
    assert meta["class_names"] == [str(i) for i in range(10)]  # the preprocessing metadata survives
    assert "calibrated on 300 images" in trained["printed"]


@pytest.mark.parametrize(("flags", "reduce"), [(NO_VNNI, True), (VNNI, False), (AVX_VNNI, False), (AMX, False),
                                               (ZEN4, False), (None, True)])
def test_reduce_range_follows_the_instruction_set(monkeypatch, flags, reduce):
    monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda: flags)
    assert vit.deploy.cpu.reduce_range_for() is reduce


def test_export_without_vnni_writes_7_bit_weights(trained, monkeypatch, tmp_path):
    """The weights of a file exported on a CPU without VNNI stay within 7 bits (onnxruntime's saturation fix);
    a VNNI CPU's use all 8. Read from the int8 initializers themselves."""
    classifier = load_classifier(trained["ckpt"])
    from vit.deploy.export import export_onnx

    largest = {}
    for name, flags in (("no_vnni", NO_VNNI), ("vnni", VNNI)):
        monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda flags=flags: flags)
        export_onnx(classifier, tmp_path / name, quantize="static", calibration=trained["images"][:16])
        proto = onnx.load(tmp_path / name / "model.int8.onnx")
        int8 = [numpy_helper.to_array(t) for t in proto.graph.initializer if t.data_type == onnx.TensorProto.INT8]
        largest[name] = max(int(np.abs(w.astype(np.int32)).max()) for w in int8)
        assert metadata(tmp_path / name / "model.int8.onnx")["quantization"]["reduce_range"] is (name == "no_vnni")
    assert largest == {"no_vnni": 64, "vnni": 127}
    # and running the 8-bit file on a CPU without VNNI warns
    monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda: NO_VNNI)
    with pytest.warns(UserWarning, match=r"quantised for a CPU with VNNI .* no VNNI"):
        load_classifier(tmp_path / "vnni" / "model.int8.onnx", backend="onnx-int8")
    # OpenVINO's int8 without VNNI ran slower than fp32 eager on an AVX2 EPYC: said, with the faster backend
    with pytest.warns(UserWarning, match=r"openvino-int8 on a CPU without VNNI \(avx2 avx512f\).*onnx-int8 runs"):
        load_classifier(tmp_path / "no_vnni" / "model.int8.onnx", backend="openvino-int8")
    monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda: VNNI)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with VNNI, neither warning
        load_classifier(tmp_path / "vnni" / "model.int8.onnx", backend="openvino-int8")
        load_classifier(tmp_path / "vnni" / "model.int8.onnx", backend="onnx-int8")


def test_onnxruntime_fuses_every_blocks_attention(trained):
    """onnxscript's ORT fusions turn each block's attention into one MultiHeadAttention: counted in the fused graph
    (4 blocks), with the same logits, and that is the graph `--backend onnx` runs."""
    proto = onnx.load(trained["fp32"])
    assert attention_nodes(proto) == 0
    fused, counts = fuse_attention(proto)
    assert counts["sdpa"] == 4  # what onnxscript says it fused; the graph below says what it holds
    fused_proto = onnx.load_from_string(fused)
    assert attention_nodes(fused_proto) == 4
    assert not any(n.op_type == "Softmax" for n in fused_proto.graph.node)  # all of it inside the fused kernel
    model = load_classifier(trained["fp32"], backend="onnx")
    assert model.fused.get("sdpa") == 4
    plain = backends.OnnxClassifier(trained["fp32"], fuse=False)
    x = trained["images"][:8]
    torch.testing.assert_close(model(x), plain(x), atol=1e-5, rtol=0)


def test_backends_the_machine_cannot_run_are_refused_by_name(trained, monkeypatch):
    ckpt, fp32, int8 = trained["ckpt"], trained["fp32"], trained["int8"]
    monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda: NO_VNNI)
    with pytest.raises(UnsupportedBackendError, match=r"torch-bf16 needs a CPU with bf16 units \(AMX-BF16 or "
                       r"AVX512-BF16\); this one has avx2 avx512f"):
        load_classifier(ckpt, backend="torch-bf16")
    monkeypatch.setattr(backends, "_importable", lambda module: module != "openvino")
    with pytest.raises(MissingPackageError, match=r"needs OpenVINO: pip install 'vit\[openvino\]'"):
        load_classifier(fp32, backend="openvino")
    monkeypatch.undo()
    with pytest.raises(UnsupportedBackendError, match=r"an ONNX file runs with --backend onnx"):
        load_classifier(fp32, backend="torch-compile")
    with pytest.raises(UnsupportedBackendError, match=r"needs a calibrated int8 file.*--int8 static"):
        load_classifier(ckpt, backend="openvino-int8")
    with pytest.raises(UnsupportedBackendError, match=r"is an fp32 model .* use --backend onnx$"):
        load_classifier(fp32, backend="onnx-int8")
    with pytest.raises(UnsupportedBackendError, match=r"is an int8 model .* use --backend openvino-int8$"):
        load_classifier(int8, backend="openvino")
    with pytest.raises(UnsupportedBackendError, match=r"runs on the CPU, not on cuda"):
        load_classifier(ckpt, "cuda", backend="onnx")


def test_predict_and_export_take_the_new_options(trained, digit_pngs, tmp_path):
    files = digit_pngs[0][:16]
    folder = files[0].parent
    rows = {b: run(["predict", "--ckpt", str(p), str(folder), "--backend", b, "--top_k", "1", "--out",
                    str(tmp_path / f"{b}.json")])
            for b, p in (("torch", trained["ckpt"]), ("openvino-int8", trained["int8"]))}
    top1 = {b: [r["top_k"][0]["class"] for r in rs] for b, rs in rows.items()}
    assert np.mean(np.array(top1["torch"]) == np.array(top1["openvino-int8"])) >= 0.99
    with pytest.warns(FutureWarning, match="--backend torch-bf16"):
        run(["predict", "--ckpt", str(trained["ckpt"]), str(files[0]), "--precision", "bf16", "--out",
             str(tmp_path / "bf16.csv")])
    with pytest.raises(SystemExit):  # static needs calibration data: a checkpoint does not record it
        main(["export", "--ckpt", str(trained["ckpt"]), "--format", "onnx", "--out", str(tmp_path), "--int8", "static"])
    with pytest.raises(FileNotFoundError, match=r"--calibration .*nowhere: expected a folder"):
        run(["export", "--ckpt", str(trained["ckpt"]), "--format", "onnx", "--out", str(tmp_path), "--int8",
              "static", "--calibration", str(tmp_path / "nowhere")])


def test_calibration_from_a_folder_is_a_random_draw_through_the_eval_transform(trained, digit_pngs, tmp_path):
    from PIL import Image

    from vit.deploy.quantize import calibration_images

    files = digit_pngs[0][:30]
    (tmp_path / "train" / "a").mkdir(parents=True)
    for f in files:
        (tmp_path / "train" / "a" / f.name).symlink_to(f)
    (tmp_path / "unrelated.png").symlink_to(digit_pngs[0][-1])  # outside train/: not drawn
    transform = load_classifier(trained["ckpt"]).eval_transform()
    drawn = calibration_images(tmp_path, transform, "L", count=12)
    assert drawn.shape == (12, 1, 16, 16)
    every = torch.stack([transform(Image.open(f).convert("L")) for f in files])
    matches = [(every == image).flatten(1).all(1).nonzero().flatten().tolist() for image in drawn]
    assert all(len(m) >= 1 for m in matches) and len({m[0] for m in matches}) == 12  # 12 different files
    torch.testing.assert_close(calibration_images(tmp_path, transform, "L", count=12), drawn)  # seeded


def test_calibration_from_a_folder_with_a_class_named_train_draws_from_every_class(trained, digit_pngs, tmp_path):
    from vit.deploy.quantize import calibration_images

    for name, files in (("train", digit_pngs[0][:3]), ("zebra", digit_pngs[0][3:43])):  # no split layout
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f.name).symlink_to(f)
    transform = load_classifier(trained["ckpt"]).eval_transform()
    assert len(calibration_images(tmp_path, transform, "L", count=12)) == 12  # not the 3 images of "train"


def test_calibration_from_a_config_goes_through_the_checkpoints_transform_not_the_datamodules():
    """A config's DataModule, built without its pretrained weights, normalises as the architecture's default would
    (ImageNet's mean and std for a fine-tuning recipe whose checkpoint was trained on augreg's 0.5): the images
    must be decoded as stored and prepared by the transform given, the checkpoint's, as `vit predict` does."""
    from vit.cli.data import calibration_images, config_split_images  # (deploy's own takes a folder alone)

    def brightness(image):  # a transform of our own: (1, 1, 1), the image's mean pixel value
        return torch.tensor(np.asarray(image), dtype=torch.float32).mean().reshape(1, 1, 1)

    drawn = calibration_images(CONFIG, brightness, "L", count=8)
    every, labels = config_split_images(CONFIG, "train", brightness, "L")  # all, in order
    assert drawn.shape == (8, 1, 1, 1) and len(every) == len(labels) > 1000 and set(labels.tolist()) == set(range(10))
    assert all((every == value).any() for value in drawn)  # (the test split: benchmark_inference.py's test)


def test_serve_takes_the_same_backends():
    from vit.commands import serve

    assert serve.parse_args(["--ckpt", "model.int8.onnx", "--backend", "openvino-int8"]).backend == "openvino-int8"
    assert serve.parse_args(["--ckpt", "last.ckpt"]).backend is None  # torch for a checkpoint, as before
    with pytest.raises(SystemExit):
        serve.parse_args(["--ckpt", "last.ckpt", "--backend", "tensorrt"])


@pytest.mark.parametrize("flags, fused", [(AMX, True), (ZEN4, False)])
def test_bf16_attention_path_follows_the_instruction_set(trained, monkeypatch, flags, fused):
    """Without AMX (AMD Zen 4) torch-bf16 computes attention as two bf16 matmuls, twice as fast there as SDPA's bf16
    kernel; with AMX SDPA stays. Either way the same top-1 as eager fp32 on the test digits."""
    from vit.nn.attention import MultiHeadAttention

    monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda: flags)
    model = load_classifier(trained["ckpt"], backend="torch-bf16")
    paths = {m.fused_attn for m in model.modules() if isinstance(m, MultiHeadAttention)}
    assert paths == {fused}
    eager = logits(load_classifier(trained["ckpt"]), trained["images"])
    assert agrees(logits(model, trained["images"]), eager, exact=False)
