"""ViT-S/16 at batch 8 on the CPU: OpenVINO's precision settings for the fp32 and the static int8 model, beside eager
fp32 and torch-bf16, timed in alternation in one process (docs/speed.md, "Against the machine").

    flock /tmp/vit-heavy.lock python scripts/experiments/openvino_precisions.py [--threads 2] [--rounds 4]

Rows: OpenVINO f32 (`--backend openvino`), bf16 hint (`openvino-bf16`), no hint (OpenVINO's default), the int8 file
with its other layers in f32 or bf16 (`openvino-int8`), and the whole graph in int8 (patch embedding, head and
attention products too). Random weights, 16 seeded noise images: agreement is printed, but a random model's top-1
margins are small (printed too).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from benchmark_inference import random_classifier

from vit.deploy.backends import Bf16Classifier
from vit.deploy.export import onnx_bytes
from vit.deploy.quantize import quantize_static_int8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import openvino

    torch.set_num_threads(args.threads)
    classifier = random_classifier("vit_small_patch16_224", 1000)
    generator = torch.Generator().manual_seed(0)  # the images benchmark_inference.py --model draws
    x = torch.randn(16, 3, 224, 224, generator=generator)
    calibration = torch.randn(32, 3, 224, 224, generator=generator)
    fp32 = onnx_bytes(classifier)
    static = quantize_static_int8(fp32, calibration, reduce_range=False)
    whole = quantize_static_int8(fp32, calibration, reduce_range=False, keep_fp32=())
    core = openvino.Core()

    def ov(data: bytes, hint: str | None):
        config = {"INFERENCE_NUM_THREADS": args.threads} | ({"INFERENCE_PRECISION_HINT": hint} if hint else {})
        compiled = core.compile_model(core.read_model(model=data), "CPU", config)
        return lambda t: torch.from_numpy(compiled(t.numpy())[0].copy())

    runners = {"torch": classifier, "torch-bf16": Bf16Classifier(copy.deepcopy(classifier)),
        "openvino f32": ov(fp32, "f32"), "openvino bf16 hint": ov(fp32, "bf16"), "openvino no hint": ov(fp32, None),
        "int8 file, rest f32": ov(static, "f32"), "int8 file, rest bf16": ov(static, "bf16"),
        "int8 file, no hint": ov(static, None), "whole graph int8, rest bf16": ov(whole, "bf16")}
    with torch.inference_mode():
        reference = classifier(x)
        top = reference.topk(2, -1).values
        print("eager top-1 margins:", ", ".join(f"{m:.3f}" for m in (top[:, 0] - top[:, 1]).tolist()))
        speed: dict[str, list[float]] = {name: [] for name in runners}
        for name, run in runners.items():
            out = torch.cat([run(x[:8]), run(x[8:])]).float()
            print(f"{name}: agreement {(out.argmax(-1) == reference.argmax(-1)).float().mean():.4f}, "
                  f"max |logit diff| {(out - reference).abs().max():.3f}", flush=True)
        for _ in range(args.rounds):
            for name, run in runners.items():
                start = time.perf_counter()
                run(x[:8]), run(x[8:])
                speed[name].append(16 / (time.perf_counter() - start))
    eager = statistics.median(speed["torch"])
    for name, ips in speed.items():
        print(f"| {name} | {statistics.median(ips):.1f} | {statistics.median(ips) / eager:.2f}x |")


if __name__ == "__main__":
    main()
