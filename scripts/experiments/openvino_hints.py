"""ViT-S/16 at batch 8, 2 threads: OpenVINO's bf16 and int8 compiled with its other settings (performance hint,
streams, pinning, a static input shape), beside eager fp32, timed in alternation in one process (docs/speed.md,
"More bf16 speed?"). Random weights (the benchmark's seeded ViT-S), 16 seeded noise images.

    flock /tmp/vit-heavy.lock python scripts/experiments/openvino_hints.py [--rounds 7]

"2 streams, async": THROUGHPUT's two streams of one thread each, the batch of 8 split into two requests of 4 run
together (`AsyncInferQueue`); the other rows run one synchronous request of 8.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from benchmark_inference import random_classifier

from vit.deploy.export import onnx_bytes
from vit.deploy.quantize import quantize_static_int8

SETTINGS = {  # name: (extra config, static batch, async streams)
    "dynamic batch (a first sighting)": ({}, None, 0),
    "fixed batch 8 (as vit runs a repeated size)": ({}, 8, 0),
    "LATENCY hint": ({"PERFORMANCE_HINT": "LATENCY"}, None, 0),
    "pinning on": ({"ENABLE_CPU_PINNING": True}, None, 0),
    "2 streams, async (4+4)": ({"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2}, 4, 2),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import openvino

    torch.set_num_threads(args.threads)
    classifier = random_classifier("vit_small_patch16_224", 1000)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, 224, 224, generator=generator)
    calibration = torch.randn(32, 3, 224, 224, generator=generator)
    fp32 = onnx_bytes(classifier)
    static = quantize_static_int8(fp32, calibration, reduce_range=False)
    core = openvino.Core()

    def build(data: bytes, precision: str | None, extra: dict, batch: int | None, streams: int):
        model = core.read_model(model=data)
        if batch:
            model.reshape({model.inputs[0].get_any_name(): [batch, 3, 224, 224]})
        config = {"INFERENCE_NUM_THREADS": args.threads, **extra}
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        compiled = core.compile_model(model, "CPU", config)
        if not streams:
            return lambda t: compiled(t.numpy())[0].copy()
        queue = openvino.AsyncInferQueue(compiled, streams)
        outputs: dict[int, np.ndarray] = {}
        queue.set_callback(lambda request, i: outputs.__setitem__(i, request.get_output_tensor(0).data.copy()))

        def run(t: torch.Tensor) -> np.ndarray:
            parts = t.numpy().reshape(streams, -1, *t.shape[1:])
            for i, part in enumerate(parts):
                queue.start_async({0: part}, i)
            queue.wait_all()
            return np.concatenate([outputs[i] for i in range(streams)])

        return run

    runners = {"torch (eager fp32)": lambda t: classifier(t).numpy()}
    for label, data, precision in (("bf16", fp32, "bf16"), ("int8", static, None)):
        for name, (extra, batch, streams) in SETTINGS.items():
            try:
                runners[f"{label}: {name}"] = build(data, precision, extra, batch, streams)
            except Exception as e:  # say so, go on
                print(f"{label}: {name}: failed ({str(e).splitlines()[0][:120]})")
    with torch.inference_mode():
        reference = classifier(x[:8]).numpy()
        for name, run in runners.items():
            run(x[:8])
            print(f"{name}: max |logit diff| {np.abs(run(x[:8]) - reference).max():.3f}", flush=True)
        speed: dict[str, list[float]] = {name: [] for name in runners}
        for r in range(args.rounds):
            for name in list(runners) if r % 2 == 0 else list(runners)[::-1]:
                start = time.perf_counter()
                runners[name](x[:8]), runners[name](x[8:])
                speed[name].append(16 / (time.perf_counter() - start))
    eager = speed["torch (eager fp32)"]
    print("| setting | img/s b8 | vs eager |\n| --- | ---: | ---: |")
    for name, ips in speed.items():
        ratio = statistics.median(i / e for i, e in zip(ips, eager))
        print(f"| {name} | {statistics.median(ips):.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
