"""The inference backends (`vit.deploy.backends`): every backend against eager fp32 on a trained digits model,
the backends a machine cannot run refused by name, and the options of predict and export that pick them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vit.deploy.cpu
from tests.deploy.conftest import NO_VNNI, agrees, logits
from tests.helpers import TINY_DIM
from vit.commands import main, run
from vit.deploy import backends, load_classifier
from vit.deploy.backends import UnsupportedBackendError
from vit.errors import MissingPackageError


def test_every_backend_agrees_with_eager_fp32_on_the_trained_model(trained):
    """Exact backends within 1e-4; bf16 and int8: the same top-1 on >= 99% of the 359 test digits and a test
    accuracy within one point (3 of 359 images)."""
    eager = logits(load_classifier(trained["ckpt"]), trained["images"])
    accuracy = (eager.argmax(-1) == trained["labels"]).float().mean().item()
    assert accuracy > 0.85  # a model that learnt, so agreement means something
    runs = {"onnx": trained["ckpt"], "openvino": trained["fp32"], "onnx-int8": trained["int8"],
            "openvino-int8": trained["int8"]}
    if vit.deploy.cpu.has_native_bf16():
        runs |= {"torch-bf16": trained["ckpt"], "openvino-bf16": trained["fp32"]}
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

    model = vit_package.create_model("vit_digits_patch4_16", num_classes=3, depth=1, embed_dim=TINY_DIM, num_heads=2)
    classifier = Classifier(model.eval(), model_name="tiny", class_names=["a", "b", "c"], mean=(0.5,), std=(0.5,),
                            crop_pct=1.0, interpolation="bilinear")
    x = torch.randn(4, 1, 16, 16)
    compiled = backends.CompiledClassifier(classifier, mode="default")
    torch.testing.assert_close(compiled(x), classifier(x), atol=1e-4, rtol=0)
    torch.testing.assert_close(compiled(x[:3]), classifier(x[:3]), atol=1e-4, rtol=0)  # a last, smaller batch
    assert compiled.sizes == {4}  # padded to the compiled size: no second compile
    assert compiled.class_names == ["a", "b", "c"] and compiled.backend == "torch-compile"
    if vit.deploy.cpu.has_native_bf16():  # the bf16 model compiled: torch-bf16's logits, up to bf16 rounding
        import copy

        eager_bf16 = backends.Bf16Classifier(copy.deepcopy(classifier))(x)
        compiled = backends.CompiledClassifier(copy.deepcopy(classifier), mode="default", bf16=True)
        assert compiled.backend == "torch-compile-bf16"
        torch.testing.assert_close(compiled(x), eager_bf16, atol=0.05, rtol=0)
        torch.testing.assert_close(compiled(x), classifier(x), atol=0.1, rtol=0)


def test_backends_the_machine_cannot_run_are_refused_by_name(trained, monkeypatch):
    ckpt, fp32, int8 = trained["ckpt"], trained["fp32"], trained["int8"]
    monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda: NO_VNNI)
    with pytest.raises(UnsupportedBackendError, match=r"torch-bf16 needs a CPU with bf16 units \(AMX-BF16 or "
                       r"AVX512-BF16\); this one has avx2 avx512f"):
        load_classifier(ckpt, backend="torch-bf16")
    for backend, path in (("openvino-bf16", fp32), ("torch-compile-bf16", ckpt)):
        with pytest.raises(UnsupportedBackendError, match=rf"{backend} needs a CPU with bf16 units"):
            load_classifier(path, backend=backend)
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
    for backend in ("openvino", "openvino-bf16"):
        with pytest.raises(UnsupportedBackendError, match=r"is an int8 model .* use --backend openvino-int8$"):
            load_classifier(int8, backend=backend)
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


def test_openvino_compiles_a_batch_size_met_twice_for_its_fixed_shape(trained, monkeypatch):
    """A batch size runs the dynamic-batch model at its first sighting and its own fixed-shape model from the
    second on (int8 kernels are chosen for known shapes: 1.22x on an AMX Xeon); at most STATIC_SHAPES sizes.
    The fixed-shape model's logits are the dynamic one's (fp32: within 1e-5)."""
    pytest.importorskip("openvino")
    monkeypatch.setattr(backends.OpenVinoClassifier, "STATIC_SHAPES", 2)
    model = load_classifier(trained["fp32"], backend="openvino", threads=1)
    x = trained["images"][:8]
    first = model(x)
    assert model.static == {}  # one sighting: no compile (a folder's last short batch never pays for one)
    again = model(x)
    assert sorted(model.static) == [8] and model.compiled_for(8) is model.static[8]
    torch.testing.assert_close(again, first, atol=1e-5, rtol=0)
    for size in (3, 3, 5, 5):  # 3 takes the second place; 5 finds the cache full and stays dynamic
        torch.testing.assert_close(model(x[:size]), first[:size], atol=1e-5, rtol=0)
    assert sorted(model.static) == [3, 8]
    assert model.compiled_for(5) is model.compiled
