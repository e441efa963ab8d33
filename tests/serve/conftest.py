"""Fixtures of the serving tests: the `fitted` checkpoint and its ONNX export loaded once, apps built around
them with any limits, an in-process client (httpx's ASGI transport, with the app's lifespan run), and
image files of every odd kind."""

from __future__ import annotations

import contextlib
import functools
import io
import re
import struct
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.conftest import subprocess_env
from vit.serve.app import create_app
from vit.serve.core import Limits, Predictor, Service


@pytest.fixture(scope="session")
def checkpoint(fitted) -> Path:
    """The tiny digits checkpoint of the shared `fitted` run."""
    return next((fitted / "ckpt").glob("best-*.ckpt"))


@pytest.fixture(scope="session")
def predictor(checkpoint) -> Predictor:
    """The checkpoint, loaded once (a Predictor holds no threads; each Service brings its own)."""
    from vit.deploy import load_classifier

    return Predictor(load_classifier(checkpoint))


@pytest.fixture(scope="session")
def onnx_predictor(exported) -> Predictor:
    """The same model's `vit export` ONNX file, run by onnxruntime."""
    from vit.deploy import load_classifier

    return Predictor(load_classifier(exported.onnx))


def make_app(predictor: Predictor, **options):
    """An app around ``predictor``; options are `Limits` fields and `create_app` keywords."""
    app_keys = {"api_key", "cors_origins"}
    limits = Limits(**{k: v for k, v in options.items() if k not in app_keys})
    return create_app(Service(predictor, limits), **{k: v for k, v in options.items() if k in app_keys})


@contextlib.asynccontextmanager
async def client_of(app, *, lifespan: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client talking to ``app`` in-process; ``lifespan`` runs its start-up (the warm-up) first."""
    transport = httpx.ASGITransport(app=app)
    async with contextlib.AsyncExitStack() as stack:
        if lifespan:
            await stack.enter_async_context(app.router.lifespan_context(app))
        yield await stack.enter_async_context(httpx.AsyncClient(transport=transport, base_url="http://serve.test"))


@contextlib.contextmanager
def serving(checkpoint: Path, *options: str, **env: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`vit serve --ckpt checkpoint --port 0 *options` in a child process, once it is warm: (its URL, the process).
    The process is killed on the way out if it still runs."""
    command = [sys.executable, "-m", "vit", "serve", "--ckpt", str(checkpoint), "--port", "0", *options]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=subprocess_env(**env))
    try:
        line = server.stdout.readline()  # blocks until the model is loaded and warm
        match = re.fullmatch(r"serving on (http://127\.0\.0\.1:\d+)\n", line)
        assert match, f"unexpected first line {line!r}"
        yield match.group(1), server
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def png_bytes(image: Image.Image, **save) -> bytes:
    """``image`` saved as PNG (or ``format=...``) in memory."""
    buffer = io.BytesIO()
    image.save(buffer, format=save.pop("format", "PNG"), **save)
    return buffer.getvalue()


@functools.cache
def huge_png(width: int = 20000, height: int = 20000) -> bytes:
    """A real, valid 1-bit PNG of width x height (all black): 400 MP that compress to about 50 kB."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte, then the packed bits
    packer = zlib.compressobj(9)
    pixels = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1 bit, grayscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


@pytest.fixture(scope="session")
def digit_bytes(digit_pngs) -> list[tuple[Path, bytes]]:
    """Eight of the test digits as (path, PNG bytes)."""
    return [(path, path.read_bytes()) for path in digit_pngs[0][:8]]


@pytest.fixture(scope="session")
def odd_images(tmp_path_factory) -> dict[str, Path]:
    """Valid images a service must answer: 1x1, L, P, RGBA, CMYK, 16-bit PNG, animated GIF (files on disk)."""
    folder = tmp_path_factory.mktemp("odd")
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (24, 20, 3), dtype=np.uint8))
    files = {
        "1x1.png": Image.new("RGB", (1, 1), (200, 10, 10)),
        "l.png": rgb.convert("L"),
        "p.png": rgb.convert("P"),
        "rgba.png": rgb.convert("RGBA"),
        "cmyk.jpg": rgb.convert("CMYK"),
        "16bit.png": Image.fromarray((rng.integers(0, 65535, (24, 20))).astype(np.uint16)),
    }
    for name, image in files.items():
        image.save(folder / name)
    frames = [Image.new("RGB", (16, 16), (i * 100, 50, 200 - i * 60)) for i in range(3)]
    frames[0].save(folder / "animated.gif", save_all=True, append_images=frames[1:], duration=50, loop=0)
    assert Image.open(folder / "16bit.png").mode.startswith("I"), "the 16-bit PNG must stay 16-bit"
    assert Image.open(folder / "animated.gif").n_frames == 3
    return {p.name: p for p in sorted(folder.iterdir())}
