"""`vit serve --ckpt model.ckpt|model.onnx`: a trained classifier as a web service, with a page at /.

    vit serve --ckpt logs/digits/checkpoints/last.ckpt --port 8000
    serving on http://127.0.0.1:8000

One process: uvicorn runs the FastAPI app (vit/serve/app.py) around a bounded asyncio batcher
(vit/serve/core.py). Answers are `vit predict`'s records for the same file. SIGTERM (or Ctrl+C) stops
accepting connections, finishes what is queued and in flight, and exits 0. Needs ``pip install 'vit[serve]'``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Sequence

from vit.errors import MissingPackageError, UserValueError


def default_threads() -> int:
    """Half the CPU cores, at least 1. A model thread with every core oversubscribes the machine: its OpenMP
    (or onnxruntime) team waits at each op for a worker that the event loop and decoding threads keep off a
    core (docs/serve.md measures what that cost)."""
    return max(1, len(os.sched_getaffinity(0)) // 2)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line options of `vit serve`."""
    parser = argparse.ArgumentParser(
        prog="vit serve",
        description="Serve a `vit fit` checkpoint or a `vit export` ONNX model over HTTP, with dynamic batching "
        "and a page at /. POST /predict takes a multipart upload (field 'file'), a raw image body, or JSON "
        '{"inputs": "<base64>", "parameters": {"top_k": 5}} and answers `vit predict`\'s record.',
    )
    parser.add_argument("--ckpt", required=True,
                        help="checkpoint written by `vit fit`, or a .onnx file written by `vit export`")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: %(default)s, this machine only; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=8000, help="port (0 picks a free one; default: %(default)s)")
    parser.add_argument("--max_batch_size", type=int, default=8, help="requests per model batch (default: %(default)s)")
    # 10 ms, not 5: on 2 cores the HTTP work, not the model, is the bottleneck, and a 5 ms window batched fewer
    # requests (docs/serve.md; scripts/bench/load_test.py --batching). A lone request never waits for it (the batch
    # closes when no other request is admitted).
    parser.add_argument("--batch_timeout_ms", type=float, default=10.0,
                        help="how long a batch waits to fill after its first request; a lone request does not "
                        "wait (default: %(default)s)")
    parser.add_argument("--max_queue", type=int, default=64,
                        help="requests held at once (decoding, waiting, in a batch); more get 503 + Retry-After "
                        "(default: %(default)s)")
    parser.add_argument("--timeout_s", type=float, default=30.0,
                        help="seconds from admission to answer before a 504 (default: %(default)s)")
    parser.add_argument("--max_body_mb", type=float, default=10.0, help="largest request body (default: %(default)s)")
    parser.add_argument("--max_pixels", type=float, default=40e6,
                        help="largest width x height, read from the header before decoding, before and after the "
                             "model's resize (default: 40e6)")
    parser.add_argument("--accept_all", action="store_true",
                        help="never answer 'unknown': a calibrated model otherwise answers its unknown label for "
                        "images far from its training data (as `vit predict --accept_all`)")
    parser.add_argument("--top_k", type=int, default=5, help="classes per answer unless asked (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (checkpoints; default: %(default)s)")
    from vit.commands.predict import add_backend_argument, add_tta_argument  # as `vit predict` takes them

    add_backend_argument(parser)
    add_tta_argument(parser)
    parser.add_argument("--threads", type=int, default=default_threads(),
                        help="CPU threads for the model (torch or onnxruntime; default: half the cores, at least 1, "
                        f"here {default_threads()}: the rest parse HTTP and decode images)")
    parser.add_argument("--cors_origin", action="append", default=None, metavar="ORIGIN",
                        help="allow browsers on ORIGIN (e.g. https://app.example.com) to call the API; repeatable. "
                        "Default: no CORS header")
    parser.add_argument("--api_key_env", default=None, metavar="VAR",
                        help="require the key in environment variable VAR as an X-API-Key header "
                        "(/health, /livez and the page stay open)")
    args = parser.parse_args(list(argv))
    for name in ("max_batch_size", "max_queue", "top_k", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    for name in ("batch_timeout_ms", "timeout_s", "max_body_mb", "max_pixels"):
        if getattr(args, name) <= 0 and not (name == "batch_timeout_ms" and args.batch_timeout_ms == 0):
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0..65535, got {args.port}")
    return args


def read_api_key(variable: str | None) -> str | None:
    """The API key from the environment variable named by --api_key_env (None without the option)."""
    if variable is None:
        return None
    key = os.environ.get(variable, "")
    if not key:
        raise UserValueError(f"--api_key_env {variable}: the environment variable {variable} is not set or empty; "
                             f"set it to the key clients will send (export {variable}=...)")
    return key


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0: a free port), or a clear error when the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on connections whose socket says TCP, and
    # without it every small answer waited for Nagle's algorithm to meet the client's delayed ACK (docs/serve.md).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UserValueError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port, "
                             "or --port 0 for a free one") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def main(argv: Sequence[str]) -> None:
    """Run `vit serve` with the given arguments (without the command name) until SIGTERM or Ctrl+C."""
    args = parse_args(argv)
    try:
        import uvicorn

        from vit.serve.app import create_app
    except ImportError as e:
        raise MissingPackageError(f"vit serve needs {e.name}: pip install 'vit[serve]'") from e
    import torch

    from vit.commands.predict import rejection_note
    from vit.deploy.backends import load_classifier
    from vit.serve.core import Limits, Predictor, Service

    torch.set_num_threads(args.threads)  # before any thread starts: the model and decoding threads inherit it

    api_key = read_api_key(args.api_key_env)
    limits = Limits(max_batch_size=args.max_batch_size, batch_timeout_ms=args.batch_timeout_ms,
                    max_queue=args.max_queue, timeout_s=args.timeout_s, max_body_mb=args.max_body_mb,
                    max_pixels=int(args.max_pixels), top_k=args.top_k)
    from PIL import Image

    # PIL refuses images over twice its own limit (179 MP) while reading the header; --max_pixels is the limit
    Image.MAX_IMAGE_PIXELS = max(Image.MAX_IMAGE_PIXELS or 0, limits.max_pixels)
    # --backend auto: timed at the largest batch, on seeded noise (a server has no images of its own yet)
    model = load_classifier(args.ckpt, args.device, backend=args.backend, threads=args.threads,
                            batch_size=args.max_batch_size)
    note = rejection_note(model, str(args.ckpt), args.accept_all)
    service = Service(Predictor(model, accept_all=args.accept_all, tta=args.tta), limits)
    app = create_app(service, api_key=api_key, cors_origins=args.cors_origin,
                     model_path=str(args.ckpt))
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)  # the app's lifespan (the warm-up batch) ran first
            if not self.should_exit:
                print(f"serving on {url}", flush=True)
                if note:  # after the first line, which scripts wait for
                    print(note, file=sys.stderr, flush=True)

    # Requests in flight get timeout_s to finish after SIGTERM; the extra seconds cover the last batch.
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=int(limits.timeout_s) + 5)
    # uvicorn (0.29+) re-raises the signal it caught once its graceful shutdown is done; with Python's default
    # SIGTERM action that kills the process (status -15) after a clean stop. This handler makes it a no-op.
    signal.signal(signal.SIGTERM, lambda *_: None)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C: the same graceful stop, re-raised by uvicorn as above
        Server(config).run(sockets=[sock])
    print("vit serve: stopped", file=sys.stderr, flush=True)
