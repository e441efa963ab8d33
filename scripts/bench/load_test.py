"""Load-test `vit serve`: a bounded asyncio + httpx client against a real uvicorn on 127.0.0.1.

Starts `vit serve --port 0` on the model itself, sends a fixed number of requests (mixing the three request
formats) from N concurrent workers, stops at the count or the time cap, and prints a table of throughput,
p50/p99 latency, errors and the server's mean batch size at each concurrency. On a small machine the client
and server share the cores, so compare ratios measured in one run, not absolute numbers across machines.

    python scripts/bench/load_test.py --ckpt logs/digits/checkpoints/last.ckpt                 # the table
    python scripts/bench/load_test.py --ckpt model.onnx --concurrency 16 --requests 400 --check  # == vit predict
    python scripts/bench/load_test.py --ckpt last.ckpt --batching      # vs --max_batch_size 1, interleaved x3
    python scripts/bench/load_test.py --ckpt last.ckpt --latency       # c=1 p50 vs the in-process forward
    python scripts/bench/load_test.py --ckpt last.ckpt --backpressure  # --max_queue 32, a burst of 128
    python scripts/bench/load_test.py --ckpt last.ckpt --rss           # RSS after 200 and after 2,000 requests
    python scripts/bench/load_test.py --ckpt last.ckpt --shutdown      # SIGTERM with 16 requests in flight

The images are the digits test split (359 PNGs, written to a temporary folder); --images uses a folder.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from vit.commands.serve import default_threads

FORMATS = ("multipart", "raw", "json")


# ---- the server ----------------------------------------------------------------------------------
@dataclass
class Server:
    """A `vit serve` child process and its URL."""

    process: subprocess.Popen
    url: str

    def rss_mb(self) -> float:
        """The server's resident memory (VmRSS), in MB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024

    def stop(self) -> int:
        """SIGTERM, then the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


def start_server(ckpt: str, *options: str) -> Server:
    """`vit serve --ckpt CKPT --port 0 OPTIONS`, once it prints `serving on URL`."""
    process = subprocess.Popen([sys.executable, "-m", "vit", "serve", "--ckpt", ckpt, "--port", "0", *options],
                               stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    match = re.match(r"serving on (\S+)", line)
    if not match:
        process.kill()
        raise SystemExit(f"vit serve did not start: {line!r}")
    return Server(process, match.group(1))


async def metric(url: str, name: str) -> float:
    """One unlabelled value from /metrics."""
    async with httpx.AsyncClient(base_url=url) as client:
        text = (await client.get("/metrics")).text
    return float(re.search(rf"^{name} (\S+)$", text, re.MULTILINE).group(1))


# ---- the client ----------------------------------------------------------------------------------
def request_kwargs(data: bytes, name: str, kind: str) -> dict:
    """httpx keyword arguments sending ``data`` in one of the three formats."""
    if kind == "multipart":
        return {"files": {"file": (name, data, "image/png")}}
    if kind == "raw":
        return {"content": data, "headers": {"Content-Type": "image/png"}}
    return {"json": {"inputs": base64.b64encode(data).decode(), "parameters": {"top_k": 5}}}


@dataclass
class Run:
    """What one load run saw."""

    concurrency: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds, of the 200s
    statuses: list[int] = field(default_factory=list)
    answers: list[tuple[int, dict]] = field(default_factory=list)  # (file index, body) of the 200s
    mean_batch: float = float("nan")

    @property
    def errors(self) -> int:
        return sum(s != 200 for s in self.statuses)

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q) * 1000) if self.latencies else float("nan")


async def load(url: str, images: list[tuple[str, bytes]], requests: int, concurrency: int, time_cap: float,
               formats: tuple[str, ...] = FORMATS) -> Run:
    """``requests`` requests from ``concurrency`` workers, each sending its next one as soon as it is answered;
    stops at the count or after ``time_cap`` seconds. The server's mean batch size comes from /metrics."""
    run, issued = Run(concurrency), 0
    batches0, batched0 = await metric(url, "vit_batch_size_count"), await metric(url, "vit_batch_size_sum")
    # A client (one keep-alive connection) per worker, each connected before the clock starts. With one shared
    # pool of 64 connections httpx made requests wait up to 4 s for a connection before sending a byte, and
    # clients made inside the timed run cost ~25 ms each (an SSL context; verify=False skips it: plain http).
    clients = [httpx.AsyncClient(base_url=url, timeout=60, verify=False) for _ in range(concurrency)]
    await asyncio.gather(*(client.get("/livez") for client in clients))
    started = time.perf_counter()

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal issued
        while issued < requests and time.perf_counter() - started < time_cap:
            index = issued
            issued += 1
            name, data = images[index % len(images)]
            sent = time.perf_counter()
            try:
                kwargs = request_kwargs(data, name, formats[index % len(formats)])
                response = await client.post("/predict", **kwargs)
                status = response.status_code
            except httpx.HTTPError:
                status = 599
            run.statuses.append(status)
            if status == 200:
                run.latencies.append(time.perf_counter() - sent)
                run.answers.append((index % len(images), response.json()))

    await asyncio.gather(*(worker(client) for client in clients))
    run.seconds = time.perf_counter() - started
    await asyncio.gather(*(client.aclose() for client in clients))
    batches = await metric(url, "vit_batch_size_count") - batches0
    run.mean_batch = (await metric(url, "vit_batch_size_sum") - batched0) / batches if batches else float("nan")
    return run


def table(runs: list[Run]) -> str:
    lines = ["| concurrency | requests | errors | throughput (req/s) | p50 (ms) | p99 (ms) | p99/p50 | mean batch |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        p50, p99 = r.percentile(50), r.percentile(99)
        lines.append(f"| {r.concurrency} | {len(r.statuses)} | {r.errors} | {r.throughput:.1f} | {p50:.1f} | "
                     f"{p99:.1f} | {p99 / p50:.2f} | {r.mean_batch:.2f} |")
    return "\n".join(lines)


# ---- the measurements ----------------------------------------------------------------------------
def digit_images(folder: Path) -> list[Path]:
    """The digits test split (`vit.data.Digits`'s) as 8x8 PNGs in ``folder``."""
    from PIL import Image
    from sklearn.datasets import load_digits

    from vit.data.io import stratified_split

    digits = load_digits()
    paths = []
    for k, i in enumerate(stratified_split(digits.target, [0.1, 0.2], seed=0)[2]):
        path = folder / f"{k:03d}_{digits.target[i]}.png"
        Image.fromarray(np.clip(digits.images[i] * 16, 0, 255).astype(np.uint8)).save(path)
        paths.append(path)
    return paths


def vit_predict(ckpt: str, files: list[Path], out: Path) -> list[dict]:
    """The records `vit predict` writes for ``files`` (the command itself, in a child process)."""
    subprocess.run([sys.executable, "-m", "vit", "predict", "--ckpt", ckpt, *map(str, files), "--out", str(out),
                    "--top_k", "5"], check=True, capture_output=True)
    return json.loads(out.read_text())


def compare(run: Run, expected: list[dict], tol: float) -> tuple[int, float]:
    """(answers whose classes differ from `vit predict`'s, the largest probability difference)."""
    wrong, worst = 0, 0.0
    for index, body in run.answers:
        want = expected[index]["top_k"]
        if [e["class"] for e in body["top_k"]] != [e["class"] for e in want]:
            wrong += 1
            continue
        worst = max([worst] + [abs(a["probability"] - e["probability"]) for a, e in zip(body["top_k"], want)])
    return wrong, worst


def in_process_forward_ms(ckpt: str, data: bytes, threads: int, repeats: int = 200) -> float:
    """Median time of the model's forward on one prepared image, in this process (no HTTP, no batching),
    with the server's number of threads."""
    import torch

    from vit.deploy import load_classifier
    from vit.serve.core import Predictor

    torch.set_num_threads(threads)
    predictor = Predictor(load_classifier(ckpt, threads=threads))
    image = predictor.prepare(data, 10**8)[None]
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            started = time.perf_counter()
            predictor.classifier(image)
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[repeats // 10:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="a `vit fit` checkpoint or a `vit export` .onnx")
    parser.add_argument("--images", type=Path, default=None, help="a folder of images (default: the digits)")
    parser.add_argument("--requests", type=int, default=400, help="requests per run (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--time_cap", type=float, default=120.0, help="seconds per run at most")
    parser.add_argument("--check", action="store_true", help="compare every answer with `vit predict`'s record")
    parser.add_argument("--batching", action="store_true", help="c=16 vs --max_batch_size 1, interleaved x3")
    parser.add_argument("--latency", action="store_true", help="c=1 p50 vs the in-process batch-1 forward")
    parser.add_argument("--backpressure", action="store_true", help="--max_queue 32, a burst of 128")
    parser.add_argument("--rss", action="store_true", help="server RSS after 200 and after 2,000 requests")
    parser.add_argument("--shutdown", action="store_true", help="SIGTERM with 16 requests in flight")
    parser.add_argument("server_options", nargs="*", help="more `vit serve` options, after --")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vit_load_"))
    files = sorted(args.images.iterdir()) if args.images else digit_images(work)
    images = [(p.name, p.read_bytes()) for p in files]
    tol = 0.0 if args.ckpt.endswith(".onnx") else 1e-4

    if args.batching:
        batched, single = start_server(args.ckpt, *args.server_options), start_server(
            args.ckpt, "--max_batch_size", "1", *args.server_options)
        ratios, mean_batches = [], []
        try:
            asyncio.run(load(batched.url, images, 64, 16, 30))  # warm both up
            asyncio.run(load(single.url, images, 64, 16, 30))
            for round_ in range(3):
                a = asyncio.run(load(batched.url, images, args.requests, 16, args.time_cap))
                b = asyncio.run(load(single.url, images, args.requests, 16, args.time_cap))
                ratios.append(a.throughput / b.throughput)
                mean_batches.append(a.mean_batch)
                print(f"round {round_ + 1}: batched {a.throughput:.1f} req/s (mean batch {a.mean_batch:.2f}, "
                      f"{a.errors} errors), max_batch_size 1 {b.throughput:.1f} req/s ({b.errors} errors): "
                      f"{ratios[-1]:.2f}x")
        finally:
            batched.stop(), single.stop()
        print(f"batching: median throughput ratio {statistics.median(ratios):.2f}x, median mean batch "
              f"{statistics.median(mean_batches):.2f}, over 3 interleaved rounds")
        return

    server = start_server(args.ckpt, *(["--max_queue", "32"] if args.backpressure else []), *args.server_options)
    try:
        if args.latency:
            options = args.server_options
            threads = int(options[options.index("--threads") + 1]) if "--threads" in options else default_threads()
            forward = in_process_forward_ms(args.ckpt, images[0][1], threads)
            asyncio.run(load(server.url, images, 50, 1, 30))  # warm-up
            run = asyncio.run(load(server.url, images, args.requests, 1, args.time_cap))
            wait = httpx.get(server.url + "/info").json()["limits"]["batch_timeout_ms"]  # the server's own
            print(f"latency: c=1 p50 {run.percentile(50):.1f} ms; in-process batch-1 forward ({threads} threads) "
                  f"{forward:.2f} ms + batch timeout {wait:g} ms + 20 ms = {forward + wait + 20:.1f} ms")
        elif args.backpressure:
            run = asyncio.run(load(server.url, images, 128, 128, args.time_cap))
            slowest = max(run.latencies)
            statuses = {s: run.statuses.count(s) for s in sorted(set(run.statuses))}
            health = httpx.get(f"{server.url}/health").status_code
            print(f"backpressure: --max_queue 32, burst of 128: statuses {statuses}; slowest 200 {slowest:.2f} s; "
                  f"/health afterwards {health}")
        elif args.rss:
            asyncio.run(load(server.url, images, 200, 16, args.time_cap))
            after_200 = server.rss_mb()
            asyncio.run(load(server.url, images, 1800, 16, 10 * args.time_cap))
            after_2000 = server.rss_mb()
            print(f"rss: {after_200:.1f} MB after 200 requests, {after_2000:.1f} MB after 2,000 "
                  f"({after_2000 - after_200:+.1f} MB)")
        elif args.shutdown:
            async def go():
                go_on, data = asyncio.Event(), images[0][1]

                async def body():  # half the image, then a pause until SIGTERM has been sent
                    yield data[: len(data) // 2]
                    await go_on.wait()
                    yield data[len(data) // 2:]

                limits = httpx.Limits(max_connections=16)
                async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
                    tasks = [asyncio.create_task(client.post("/predict", content=body(),
                                                             headers={"Content-Type": "image/png"}))
                             for _ in range(16)]
                    while await metric(server.url, "vit_in_flight") < 17:  # the 16 and the /metrics request
                        await asyncio.sleep(0.02)
                    server.process.send_signal(signal.SIGTERM)
                    signalled = time.perf_counter()
                    await asyncio.sleep(0.2)
                    go_on.set()
                    responses = await asyncio.gather(*tasks, return_exceptions=True)
                    code = await asyncio.to_thread(server.process.wait, 30)
                    seconds = time.perf_counter() - signalled
                    return [getattr(r, "status_code", repr(r)) for r in responses], code, seconds
            statuses, code, seconds = asyncio.run(go())
            print(f"shutdown: SIGTERM with 16 requests in flight (each half-sent): statuses {statuses}; "
                  f"exit {code} after {seconds:.2f} s")
        else:
            expected = vit_predict(args.ckpt, files, work / "predictions.json") if args.check else None
            asyncio.run(load(server.url, images, 64, 16, 30))  # warm-up
            runs = []
            for concurrency in args.concurrency:
                runs.append(asyncio.run(load(server.url, images, args.requests, concurrency, args.time_cap)))
                if expected is not None:
                    wrong, worst = compare(runs[-1], expected, tol)
                    print(f"c={concurrency}: {len(runs[-1].answers)} answers, {wrong} with other classes than "
                          f"`vit predict`, largest probability difference {worst:.2g}")
                print(table(runs).splitlines()[-1], flush=True)  # each row as it is measured
            print(table(runs))
    finally:
        if server.process.poll() is None:
            server.stop()


if __name__ == "__main__":
    main()
