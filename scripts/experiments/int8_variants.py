"""Which static int8 keeps eager fp32's answers, and at what speed: variants of the calibrated int8 file (which
layers stay in float, how the activation ranges are calibrated), run by OpenVINO (the rest at its bf16 default on
bf16 CPUs), beside eager fp32 and openvino-bf16, in one process (docs/speed.md, "int8 within tolerance?").

    flock /tmp/vit-heavy.lock python scripts/experiments/int8_variants.py --model vit_small_patch16_224
    flock /tmp/vit-heavy.lock python scripts/experiments/int8_variants.py --ckpt CKPT --config CONFIG --images 300

``--model``: the benchmark's random ViT-S (the same seeded weights, 16 noise images, 32 noise calibration images,
as `scripts/bench/benchmark_inference.py --model` draws them). ``--ckpt``/``--config``: a trained model, the first
``--images`` of its test split and 300 training images for calibration, as `vit export --int8 static
--calibration CONFIG` draws them. Per variant: top-1 agreement with eager, the largest softmax and logit
differences, eager's top-1 margins (logits) where an answer changed, and img/s at batch 8 (median of alternating
rounds) against eager's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from benchmark_inference import config_splits, flipped_margins, random_classifier

from vit.deploy import load_classifier
from vit.deploy.backends import OpenVinoClassifier
from vit.deploy.cpu import reduce_range_for
from vit.deploy.export import onnx_bytes
from vit.deploy.quantize import CALIBRATION_BATCH, CALIBRATION_IMAGES, quantizable_nodes


def weight_shapes(proto) -> dict[str, tuple[int, ...]]:
    """Each weight MatMul node's weight shape (K, N), in graph order."""
    inits = {i.name: tuple(i.dims) for i in proto.graph.initializer}
    return {n.name: inits[n.input[1]] for n in proto.graph.node
            if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in inits}


def variant_nodes(proto, variant: str) -> list[str]:
    """The nodes a variant quantises: the exported file's (the Linear layers) less what it keeps in float."""
    nodes = quantizable_nodes(proto)
    shapes = weight_shapes(proto)
    linear = [n for n in nodes if n in shapes]
    if variant == "fc2 kept":  # fc2's input is GELU's output: the widest activation range of a block
        return [n for n in nodes if not (n in shapes and shapes[n][0] > 2 * shapes[n][1])]
    if variant == "last block kept":
        return [n for n in nodes if n not in linear[-4:]]
    if variant == "last 2 blocks kept":
        return [n for n in nodes if n not in linear[-8:]]
    return nodes


def quantize(fp32: bytes, calibration: torch.Tensor, nodes: list[str], method: str, moving_average: bool) -> bytes:
    """onnxruntime's static QDQ quantiser as `vit.deploy.quantize.quantize_static_int8` calls it, with the node
    list and the calibration method open."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    name = onnx.load_from_string(fp32).graph.input[0].name
    batches = [calibration[i:i + CALIBRATION_BATCH].float().numpy()
               for i in range(0, len(calibration), CALIBRATION_BATCH)]

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(batches)

        def get_next(self):
            batch = next(self.left, None)
            return None if batch is None else {name: batch}

    extra = {"WeightSymmetric": True, "ActivationSymmetric": False, "CalibMovingAverage": moving_average}
    if method == "Percentile":
        extra["CalibPercentile"] = 99.999
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp, "fp32.onnx"), Path(tmp, "int8.onnx")
        source.write_bytes(fp32)
        quantize_static(source, target, Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                        reduce_range=reduce_range_for(), activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8, calibrate_method=getattr(CalibrationMethod, method),
                        op_types_to_quantize=["MatMul", "Conv", "Gemm"], nodes_to_quantize=nodes,
                        extra_options=extra)
        return target.read_bytes()


VARIANTS = {  # name: (nodes kept in float, calibration method, moving average)
    "int8 as exported (MinMax)": ("as exported", "MinMax", False),
    "int8, MinMax moving average": ("as exported", "MinMax", True),
    "int8, percentile 99.999": ("as exported", "Percentile", False),
    "int8, fc2 kept": ("fc2 kept", "MinMax", False),
    "int8, last block kept": ("last block kept", "MinMax", False),
    "int8, last 2 blocks kept": ("last 2 blocks kept", "MinMax", False),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model")
    source.add_argument("--ckpt")
    parser.add_argument("--config")
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip", nargs="*", default=[], help="variants to leave out")
    parser.add_argument("--json")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    if args.model:
        classifier = random_classifier(args.model, 1000)
        generator = torch.Generator().manual_seed(0)  # benchmark_inference.py --model's draws
        images = torch.randn(16, classifier.in_chans, *classifier.img_size, generator=generator)
        calibration = torch.randn(32, classifier.in_chans, *classifier.img_size, generator=generator)
    else:
        classifier = load_classifier(args.ckpt)
        images, _, calibration = config_splits(args.config, None, CALIBRATION_IMAGES, classifier)
        images = images[:args.images]
    import onnx

    fp32 = onnx_bytes(classifier)
    proto = onnx.load_from_string(fp32)
    runners = {"openvino-bf16": OpenVinoClassifier(fp32, args.threads, bf16=True)}
    for name, (nodes, method, moving) in VARIANTS.items():
        if name in args.skip:
            continue
        start = time.perf_counter()
        try:
            runners[name] = OpenVinoClassifier(quantize(fp32, calibration, variant_nodes(proto, nodes), method,
                                                        moving), args.threads)
        except Exception as e:  # say so, go on
            print(f"{name}: failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})", flush=True)
            continue
        print(f"{name}: quantised and compiled in {time.perf_counter() - start:.0f} s", flush=True)

    def run_all(run, x):
        return torch.cat([run(x[i:i + 8]).float() for i in range(0, len(x), 8)])

    with torch.inference_mode():
        reference = run_all(classifier, images)
        top = reference.topk(2, -1).values
        rows = {}
        for name, run in runners.items():
            out = run_all(run, images)
            rows[name] = {"agreement": (out.argmax(-1) == reference.argmax(-1)).float().mean().item(),
                          "max_prob_diff": (out.softmax(-1) - reference.softmax(-1)).abs().max().item(),
                          "max_logit_diff": (out - reference).abs().max().item(),
                          "flipped_margins": flipped_margins(reference, out)}
        timed = {"torch": classifier, **runners}
        x = images[:16]
        speed: dict[str, list[float]] = {name: [] for name in timed}
        for run in timed.values():
            run_all(run, x)  # warm-up
        for r in range(args.rounds):
            for name in list(timed) if r % 2 == 0 else list(timed)[::-1]:
                start = time.perf_counter()
                run_all(timed[name], x)
                speed[name].append(len(x) / (time.perf_counter() - start))
    eager = statistics.median(speed["torch"])
    margins = top[:, 0] - top[:, 1]
    print(f"{len(images)} images; eager top-1 margin (logits): median {margins.median():.4f}, min {margins.min():.4f}")
    print("| variant | img/s b8 | vs eager | top-1 agreement | max prob diff | max logit diff | eager margins where "
          "changed |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    print(f"| torch (eager fp32) | {eager:.1f} | 1.00x | 1.0000 | 0 | 0 | |")
    for name, row in rows.items():
        ips = statistics.median(speed[name])
        row |= {"img_s_b8": ips, "ratio_b8": statistics.median(i / e for i, e in zip(speed[name], speed["torch"]))}
        flips = ", ".join(f"{m:.3f}" for m in row["flipped_margins"])
        print(f"| {name} | {ips:.1f} | {row['ratio_b8']:.2f}x | {row['agreement']:.4f} | {row['max_prob_diff']:.4f} "
              f"| {row['max_logit_diff']:.3f} | {flips} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"images": len(images), "eager_img_s_b8": eager, "rows": rows},
                                              indent=1))


if __name__ == "__main__":
    main()
