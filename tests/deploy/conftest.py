"""What the deploy tests share: the trained digits model exported once (fp32 and calibrated int8), the agreement bar
of a backend against eager fp32, and the CPU flag sets that the instruction-set choices are mocked with."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch

from tests import CONFIGS
from tests.conftest import built_once
from tests.helpers import TINY_DIM

CONFIG = CONFIGS / "digits.yaml"
NO_VNNI = frozenset({"avx2", "avx512f", "fma"})  # an AVX-512 CPU of before Cascade Lake, or AMD Zen 2/3
VNNI = frozenset({"avx2", "avx512f", "avx512_vnni"})
AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8"})
ZEN4 = frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"})  # AMD EPYC Genoa: bf16 dot products, no AMX
AVX_VNNI = frozenset({"avx2", "avx_vnni"})  # Intel Alder/Arrow Lake: 256-bit VNNI, no AVX-512


@pytest.fixture(scope="session")
def trained(digits_run, tmp_path_factory) -> dict:
    """The trained digits checkpoint, exported once per suite by the command with static int8 calibrated on its
    config's training split; and the digits test split as the DataModule prepares it. Shared: read it, never
    change it (a test that needs to change a file copies it)."""
    from vit.commands import main
    from vit.data import Digits

    def export(out: Path) -> None:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            main(["export", "--ckpt", str(digits_run.best), "--format", "onnx", "--out", str(out), "--int8", "static",
                  "--calibration", str(CONFIG)])
        (out / "printed.txt").write_text(printed.getvalue())

    out = built_once(tmp_path_factory, "backends", export)
    data = Digits(img_size=16)
    data.setup("test")
    images, labels = zip(*(data.test_set[i] for i in range(len(data.test_set))))
    return dict(ckpt=digits_run.best, fp32=out / "model.onnx", int8=out / "model.int8.onnx",
                printed=(out / "printed.txt").read_text(), images=torch.stack(images), labels=torch.as_tensor(labels))


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


@pytest.fixture(scope="module")
def hub(fitted, tmp_path_factory) -> Path:
    """The `fitted` digits run's best checkpoint exported with --format hub."""
    from vit.commands import main

    out = tmp_path_factory.mktemp("hub") / "digits"
    main(["export", "--ckpt", str(next((fitted / "ckpt").glob("best-*.ckpt"))), "--format", "hub", "--out", str(out)])
    return out


@pytest.fixture(scope="session")
def lora_run(tmp_path_factory) -> dict:
    """A DoRA fit of the digits on a 'pretrained' base file (random weights moved off their init, timm layout), EMA
    on: the thin checkpoint and the base. Shared: read it, never change it."""
    from safetensors.torch import save_file

    import vit
    from tests.conftest import short_digits_run
    from tests.nn.test_vision import perturb
    from vit.cli.main import cli

    def fit(root: Path) -> None:
        base = perturb(vit.create_model("vit_digits_patch4_16", depth=1, embed_dim=TINY_DIM, num_heads=2))
        save_file({k: v.contiguous() for k, v in base.state_dict().items()}, root / "base.safetensors")
        cli(["fit", *short_digits_run(root, steps=6), "--test_after_fit=false",
             f"--model.init_args.pretrained={root / 'base.safetensors'}", "--model.init_args.finetune={class_path: "
             "vit.tasks.finetune.Adapters, init_args: {dora: true, rank: 4, targets: [q, k, v, proj, fc1, fc2]}}"])

    root = built_once(tmp_path_factory, "lora_run", fit)
    return dict(ckpt=root / "ckpt" / "last.ckpt", base=root / "base.safetensors", root=root)
