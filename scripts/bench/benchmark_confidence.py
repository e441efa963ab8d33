"""What the "unknown" score costs: `vit predict` and `vit serve`'s model batches with and without it, and the bytes
it adds to a checkpoint.

    flock /tmp/vit-heavy.lock python scripts/bench/benchmark_confidence.py --ckpt CALIBRATED.ckpt IMAGES_FOLDER

The same calibrated checkpoint is timed three ways, interleaved over ``--rounds`` rounds (the median is reported):
"uncalibrated" (its confidence removed: the plain forward), "calibrated" (T and the score), and "accept_all"
(the score computed, never used to reject). predict: `predict_files` over the folder's images (decoding included,
as the command runs); serve: `Predictor.run` on batches of ``--serve_batch`` prepared images (the model thread).
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from pathlib import Path

import torch


def timed(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", type=Path, required=True, help="a calibrated checkpoint (vit calibrate / vit fit)")
    parser.add_argument("images", type=Path, help="a folder of images to predict")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--serve_batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from vit.checkpoints.io import read_checkpoint
    from vit.data.io import find_images
    from vit.deploy.classifier import read_classifier
    from vit.deploy.predict import predict_files
    from vit.serve.core import Job, Predictor

    stored = read_checkpoint(args.ckpt)["confidence"]
    buffer = io.BytesIO()
    torch.save(stored, buffer)
    classifier = read_classifier(args.ckpt)
    confidence = classifier.confidence
    files = find_images([args.images]).files
    from PIL import Image

    transform = classifier.eval_transform()
    prepared = [transform(Image.open(p).convert(classifier.image_mode)) for p in files[:args.serve_batch]]
    jobs = [Job(x, 5, False, future=None) for x in prepared]  # type: ignore[arg-type]
    ways = {"uncalibrated": (None, False), "calibrated": (confidence, False), "accept_all": (confidence, True)}
    predict_s = {k: [] for k in ways}
    serve_s = {k: [] for k in ways}
    for _ in range(args.rounds):  # interleaved: a busy machine slows every way alike
        for name, (conf, accept_all) in ways.items():
            classifier.confidence = conf
            predict_s[name].append(timed(lambda a=accept_all: predict_files(classifier, files, accept_all=a), 1))
            predictor = Predictor(classifier, accept_all=accept_all)
            serve_s[name].append(timed(lambda p=predictor: [p.run(jobs) for _ in range(20)], 1) / 20)
    result = {"images": len(files), "confidence_bytes": buffer.tell()}
    print(f"{len(files)} images, {args.threads} threads, median of {args.rounds} rounds; the stored confidence "
          f"(T, threshold, class means, precision) takes {buffer.tell() / 1024:.1f} KiB in the checkpoint")
    print("| way | predict images/s | ratio | serve batch of "
          f"{args.serve_batch}: ms | images/s | ratio |\n|---|---:|---:|---:|---:|---:|")
    base_p = len(files) / statistics.median(predict_s["uncalibrated"])
    base_s = args.serve_batch / statistics.median(serve_s["uncalibrated"])
    for name in ways:
        p = len(files) / statistics.median(predict_s[name])
        s = args.serve_batch / statistics.median(serve_s[name])
        result[name] = {"predict_ips": p, "serve_ips": s}
        print(f"| {name} | {p:.0f} | {p / base_p:.2f} | {1000 * statistics.median(serve_s[name]):.2f} | {s:.0f} | "
              f"{s / base_s:.2f} |")
    return result


if __name__ == "__main__":
    main()
