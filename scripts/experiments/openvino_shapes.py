"""OpenVINO with a dynamic batch axis against a model compiled for the batch's fixed shape, and two streams of
half a batch each, for bf16 and the static int8 file, beside eager fp32, in one process (docs/speed.md, "An AMX
Xeon").

    flock /tmp/vit-heavy.lock python scripts/experiments/openvino_shapes.py [--rounds 5]

The benchmark's random ViT-S/16 (the same seeded weights, 16 noise images, 32 noise calibration images, as
`scripts/bench/benchmark_inference.py --model vit_small_patch16_224` draws them), batch 8, 2 threads. Per variant:
top-1 agreement with eager and the largest logit difference on the 16 images, and img/s at batch 8 (median of
alternating rounds of >= 1.5 s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from benchmark_inference import random_classifier

from vit.deploy.cpu import reduce_range_for
from vit.deploy.export import onnx_bytes
from vit.deploy.quantize import quantize_static_int8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import openvino

    torch.set_num_threads(args.threads)
    classifier = random_classifier("vit_small_patch16_224", 1000)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(16, 3, 224, 224, generator=generator)
    calibration = torch.randn(32, 3, 224, 224, generator=generator)
    fp32 = onnx_bytes(classifier)
    int8 = quantize_static_int8(fp32, calibration, reduce_range=reduce_range_for())
    core = openvino.Core()

    def read(data: bytes, batch: int | None) -> object:
        model = core.read_model(model=data)
        if batch is not None:
            model.reshape({model.inputs[0]: [batch, 3, 224, 224]})
        return model

    def one(data: bytes, batch: int | None, config: dict) -> object:
        compiled = core.compile_model(read(data, batch), "CPU", {"INFERENCE_NUM_THREADS": args.threads, **config})
        return lambda x: torch.from_numpy(compiled(x.numpy())[0].copy())

    def two_streams(data: bytes, config: dict) -> object:
        compiled = core.compile_model(read(data, 4), "CPU", {"INFERENCE_NUM_THREADS": args.threads,
                                                             "PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2,
                                                             **config})
        requests = [compiled.create_infer_request() for _ in range(2)]

        def run(x: torch.Tensor) -> torch.Tensor:
            for request, part in zip(requests, (x[:4], x[4:]), strict=True):
                request.start_async({0: part.numpy()})
            for request in requests:
                request.wait()
            return torch.cat([torch.from_numpy(r.get_output_tensor(0).data.copy()) for r in requests])
        return run

    bf16 = {"INFERENCE_PRECISION_HINT": "bf16"}
    variants = {
        "eager fp32": classifier,
        "bf16, dynamic batch": one(fp32, None, bf16), "bf16, fixed batch 8": one(fp32, 8, bf16),
        "bf16, 2 streams of 4": two_streams(fp32, bf16),
        "int8, dynamic batch": one(int8, None, {}), "int8, fixed batch 8": one(int8, 8, {}),
        "int8, 2 streams of 4": two_streams(int8, {}),
    }
    with torch.inference_mode():
        reference = torch.cat([classifier(images[:8]), classifier(images[8:])])
        for name, run in variants.items():
            out = torch.cat([run(images[:8]), run(images[8:])])
            same = (out.argmax(1) == reference.argmax(1)).float().mean().item()
            print(f"{name}: same top-1 {same:.4f}, max |logit diff| {(out - reference).abs().max().item():.4f}")
        speeds: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(args.rounds):
            for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                run, batch = variants[name], images[:8]
                run(batch)
                count, start = 0, time.perf_counter()
                while time.perf_counter() - start < 1.5:
                    run(batch)
                    count += 1
                speeds[name].append(8 * count / (time.perf_counter() - start))
    eager = statistics.median(speeds["eager fp32"])
    print("| variant | img/s b8 | vs eager |\n| --- | ---: | ---: |")
    for name, values in speeds.items():
        print(f"| {name} | {statistics.median(values):.1f} | {statistics.median(values) / eager:.2f}x |")


if __name__ == "__main__":
    main()
