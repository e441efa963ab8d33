"""The serving core, without HTTP: check an upload, decode it, batch it, predict.

    bytes ─► check_upload: the byte count, the format allow-list, width × height from the header (no decoding)
          ─► decode: vit.data.io.load_image (to_rgb, the model's mode), then the model's eval transform
          ─► Batcher: admits at most max_queue requests; gathers up to max_batch_size in batch_timeout_ms
          ─► the model, one batch at a time on its own thread ─► vit.deploy.inference.ranked (`vit predict`'s top-k)

Everything before the batch runs per request and off the event loop, so a bad upload fails alone with its
own `RequestError` (status, code, detail) and never joins a batch; app.py turns these into HTTP answers.
The loading, reading, preprocessing and top-k are `vit predict`'s, so an answer equals its record.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from vit.data.io import READS_HEIC, bomb_size, load_image, pil_refusal_limit
from vit.deploy.classifier import Classifier
from vit.deploy.inference import OnnxClassifier, answered, chosen_tta, record
from vit.preprocessing import resized_pixels

log = logging.getLogger(__name__)

# The PIL plugins that may open an upload (JPEG also opens the multi-picture MPO files of phone cameras).
ACCEPTED_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP", "PPM") + (("HEIF",) if READS_HEIC else ())
ACCEPTED_NAMES = "JPEG, PNG, GIF, BMP, TIFF, WebP" + (", PNM or HEIC" if READS_HEIC else " or PNM")
OVERLAY_SIDE = 224  # the attention overlay's short side: an 8x8 digit is drawn with visible pixels


class RequestError(Exception):
    """A request that cannot be answered: its HTTP status, a short machine-readable code, and words for a person."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers or {}


@dataclass(frozen=True)
class Limits:
    """What the service accepts and how much it holds (the `vit serve` options of the same names)."""

    max_batch_size: int = 8
    batch_timeout_ms: float = 10.0
    max_queue: int = 64  # requests admitted and not yet answered: decoding, waiting, or in a batch
    timeout_s: float = 30.0  # from admission to answer; then 504
    max_body_mb: float = 10.0
    max_pixels: int = 40_000_000
    top_k: int = 5

    @property
    def max_body_bytes(self) -> int:
        """The body limit in bytes (an MB is 2**20 bytes)."""
        return int(self.max_body_mb * 2**20)


# ---- one upload, on its own ------------------------------------------------------------------
def check_upload(data: bytes, max_pixels: int) -> tuple[int, int]:
    """(width, height) of an upload, or a `RequestError` for one that is empty, not an accepted format, or over
    ``max_pixels``, judged from the header alone: nothing is decoded, so a 20000 × 20000 PNG costs microseconds."""
    if not data:
        raise RequestError(400, "empty", "the image is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS) as img:  # reads the header only
                width, height = img.size
    except Image.DecompressionBombError as e:  # PIL's own guard, at twice its MAX_IMAGE_PIXELS, fires in open()
        # `vit serve` raises PIL's limit to --max_pixels, so PIL's guard says more only where it is not `vit serve`
        pil_limit = pil_refusal_limit()
        limit = f"{max_pixels:,} (--max_pixels)" if max_pixels <= pil_limit else f"{pil_limit:,} (PIL's)"
        raise RequestError(422, "too_many_pixels", f"the image is {bomb_size(e)}, over this server's limit of "
                           f"{limit}; send a smaller image") from None
    except UnidentifiedImageError:
        heic = not READS_HEIC and data[4:8] == b"ftyp" and data[8:12] in (
            b"heic", b"heix", b"hevc", b"heim", b"heis", b"mif1", b"msf1")
        raise RequestError(415, "unsupported_image", f"the upload is not a {ACCEPTED_NAMES} image" + (
            ": it is a HEIC photo (an iPhone's), which this server reads only with pillow-heif installed; send it as "
            "JPEG (the iPhone's Settings > Camera > Formats > Most Compatible takes JPEGs)" if heic else "")) from None
    except Exception as e:  # anything else a header can do wrong
        raise RequestError(400, "bad_image", f"unreadable image header ({type(e).__name__}: {e})") from None
    if width * height > max_pixels:
        raise RequestError(422, "too_many_pixels", f"the image is {width}x{height} = {width * height:,} pixels, "
                           f"over this server's limit of {max_pixels:,} (--max_pixels); send a smaller image")
    return width, height


def check_resized(width: int, height: int, short_side: int, max_pixels: int) -> None:
    """A 422 for an image the eval transform would blow up past ``max_pixels`` by scaling its short side up to
    ``short_side`` before the centre crop: a 4-kB PNG of 4,000,000 x 1 pixels passes the header check and
    would become 16 x 64,000,000 pixels (3 GB) for an 8x8 model."""
    resized = resized_pixels(width, height, short_side)
    if resized > max_pixels:
        raise RequestError(422, "too_many_pixels", f"the image is {width}x{height}: scaling its short side to the "
                           f"model's {short_side} pixels would make it {resized:,.0f} pixels, over this server's "
                           f"limit of {max_pixels:,} (--max_pixels); crop it to a less elongated shape")


def decode(data: bytes, mode: str, short_side: int | None = None) -> Image.Image:
    """Decode checked bytes as `vit predict` reads a file (`load_image`), or raise a 400 `RequestError`."""
    try:
        return load_image(io.BytesIO(data), mode=mode, short_side=short_side)
    except OSError as e:  # load_image turns every decoding failure into an OSError
        cause = e.__cause__ or e
        raise RequestError(400, "bad_image", f"the image cannot be decoded: {cause}") from None


@dataclass
class Job:
    """One checked, decoded and prepared request, waiting for a batch."""

    image: Tensor  # (C, H, W), prepared by the model's eval transform
    top_k: int
    attention: bool
    future: asyncio.Future
    queued: float = field(default_factory=time.perf_counter)


@dataclass
class Answer:
    """What the model thread hands back for one job."""

    top_k: list[dict]
    batch_size: int
    started: float  # perf_counter when its batch began
    inference_ms: float
    overlay_png: str | None = None  # base64 PNG of the attention rollout over the image
    unknown: dict | None = None  # the decision beside top_k: answer (unknown, score), or labels (`answered`)


# ---- the model -------------------------------------------------------------------------------
class Predictor:
    """A loaded model and what it takes to prepare its input; `run` is called on the model thread only."""

    def __init__(self, classifier: Classifier | OnnxClassifier | Any, accept_all: bool = False,
                 tta: str | None = None) -> None:
        self.classifier = classifier  # Any: a `vit.deploy.backends` engine
        self.accept_all = accept_all  # never answer "unknown" (--accept_all)
        self.tta = tta  # --tta; None: the one calibration chose on val
        chosen_tta(classifier, tta)  # a refused --tta (multi-label flip) stops the server at start, not each answer
        self.mode = classifier.image_mode  # as `vit predict` decodes
        self.transform = classifier.eval_transform()
        self.short_side = classifier.eval_short_side()  # resized to, then cropped
        # Rollout reads the eager fp32 ViT's attention: not an ONNX file's, nor a bf16, compiled or OpenVINO one's,
        # nor a convnet's (teacher_small's).
        self.attention = isinstance(classifier, Classifier) and classifier.is_vit

    @property
    def backend(self) -> str:
        """"onnxruntime", "torch (DEVICE)", or the `--backend` engine's name ("torch-bf16 (cpu)", "openvino")."""
        if isinstance(self.classifier, OnnxClassifier):
            return "onnxruntime"
        name = getattr(self.classifier, "backend", "torch")
        return f"{name} ({self.classifier.device})" if name.startswith("torch") else name

    def prepare(self, data: bytes, max_pixels: int) -> Tensor:
        """Check, decode and transform one upload: (C, H, W). Runs on a decoding thread."""
        check_resized(*check_upload(data, max_pixels), self.short_side, max_pixels)
        return self.transform(decode(data, self.mode, self.short_side))

    @torch.no_grad()
    def run(self, jobs: list[Job]) -> list[Answer]:
        """One batch: logits for every job at once, then each job's own top-k (and overlay)."""
        started = time.perf_counter()
        images = torch.stack([job.image for job in jobs]).to(self.classifier.device)  # (B, C, H, W)
        k = max(job.top_k for job in jobs)
        answers = answered(self.classifier, images, k, self.accept_all, self.tta)
        inference_ms = (time.perf_counter() - started) * 1000
        return [Answer(e[:job.top_k], len(jobs), started, inference_ms,
                       self.overlay(job.image) if job.attention else None, extra)
                for job, (e, extra) in zip(jobs, answers)]

    def overlay(self, image: Tensor) -> str:
        """The attention rollout over the prepared image as a base64 PNG, as `vit attention` draws it."""
        from vit.explain.maps import rollout_streaming
        from vit.explain.plot import overlay, to_display_image

        model = self.classifier.model
        _, heat = rollout_streaming(model, image[None].to(self.classifier.device))  # (1, h, w)
        display = to_display_image(image, self.classifier.mean, self.classifier.std, min_side=OVERLAY_SIDE)
        pixels = (overlay(display, heat[0].cpu()) * 255 + 0.5).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        return base64.b64encode(buffer.getvalue()).decode("ascii")

    def warm_up(self, batch_size: int) -> None:
        """Run a batch of ``batch_size`` blank images and one of a single image (first-call costs paid here)."""
        blank = Image.new(self.mode, (self.classifier.img_size[1], self.classifier.img_size[0]))
        image = self.transform(blank)
        for size in (batch_size, 1):
            self.run([Job(image, 1, False, future=None) for _ in range(size)])  # type: ignore[arg-type]


# ---- batching --------------------------------------------------------------------------------
class Service:
    """The whole path from bytes to a `vit predict` record, with bounded admission and dynamic batching.

    ``await answer(data, ...)`` is all a front end calls; `start` and `stop` run inside an event loop.
    """

    def __init__(self, predictor: Predictor, limits: Limits = Limits(),
                 on_batch: Callable[[int], None] | None = None) -> None:
        self.predictor, self.limits, self.on_batch = predictor, limits, on_batch
        self.ready = False  # loaded and warmed up
        self.default_top_k = min(limits.top_k, len(predictor.classifier.class_names))  # as `vit predict` clips it
        self.admitted = 0  # requests between admission and answer
        self.batches = self.batched = 0  # batches run and requests they held: the mean batch size
        self._queue: asyncio.Queue[Job] | None = None
        self._worker: asyncio.Task | None = None
        # one model thread (batches never overlap); a few decoding threads (PIL releases the GIL)
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="vit-model")
        self._decoders = ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="vit-decode")

    @property
    def queued(self) -> int:
        """Jobs decoded and waiting for a batch."""
        return self._queue.qsize() if self._queue is not None else 0

    async def start(self) -> None:
        """Warm the model up on its thread, then start batching; `ready` is True afterwards."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._model_thread, self.predictor.warm_up, self.limits.max_batch_size)
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._batch_forever(), name="vit-batcher")
        self.ready = True

    async def stop(self) -> None:
        """Stop batching (the HTTP server has already let the requests in flight finish) and free the threads."""
        self.ready = False
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._model_thread.shutdown(wait=True)
        self._decoders.shutdown(wait=True)

    @contextlib.contextmanager
    def _admission(self) -> Iterator[None]:
        if self.admitted >= self.limits.max_queue:
            raise RequestError(503, "queue_full", f"the server is busy ({self.admitted} requests waiting, the "
                               f"limit is {self.limits.max_queue}); retry shortly", headers={"Retry-After": "1"})
        self.admitted += 1
        try:
            yield
        finally:
            self.admitted -= 1

    async def answer(self, data: bytes, *, top_k: int | None = None, attention: bool = False,
                     name: str = "upload") -> dict:
        """`vit predict`'s record for one upload (path = ``name``), plus ``timing_ms`` (and ``attention_png``)."""
        if not self.ready or self._queue is None:
            raise RequestError(503, "not_ready", "the model is still loading; retry shortly",
                               headers={"Retry-After": "1"})
        if attention and not self.predictor.attention:
            raise RequestError(422, "attention_unavailable", "attention maps need a ViT `vit fit` checkpoint "
                               f"served with --backend torch; this server runs {self.predictor.classifier.model_name} "
                               f"on {self.predictor.backend}")
        arrived = time.perf_counter()
        with self._admission():
            try:
                return await asyncio.wait_for(self._answer(data, top_k or self.default_top_k, attention, name, arrived),
                                              self.limits.timeout_s)
            except asyncio.TimeoutError:
                raise RequestError(504, "timeout", f"no answer within {self.limits.timeout_s:g} s (--timeout_s); "
                                   "the server is overloaded") from None

    async def _answer(self, data: bytes, top_k: int, attention: bool, name: str, arrived: float) -> dict:
        loop = asyncio.get_running_loop()
        image = await loop.run_in_executor(self._decoders, self.predictor.prepare, data, self.limits.max_pixels)
        job = Job(image, top_k, attention, loop.create_future())
        self._queue.put_nowait(job)
        result: Answer = await job.future
        done = time.perf_counter()
        timing = {"decode": (job.queued - arrived) * 1000, "queue": (result.started - job.queued) * 1000,
                  "inference": result.inference_ms, "total": (done - arrived) * 1000}
        answer = {**record(name, result.top_k), **(result.unknown or {}), "batch_size": result.batch_size,
                  "timing_ms": {k: round(v, 3) for k, v in timing.items()}}
        if result.overlay_png is not None:
            answer["attention_png"] = result.overlay_png
        return answer

    async def _next_batch(self) -> list[Job]:
        """The first waiting job, and those that arrive within the batch timeout, up to the batch size.

        The batch stops waiting early when no other request is admitted (none is decoding or queued):
        a lone request does not pay the timeout for company that cannot come.
        """
        queue, loop = self._queue, asyncio.get_running_loop()
        batch = [await queue.get()]
        deadline = loop.time() + self.limits.batch_timeout_ms / 1000
        while len(batch) < self.limits.max_batch_size:
            if not queue.empty():
                batch.append(queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0 or self.admitted <= len(batch):
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return [job for job in batch if not job.future.done()]  # a job that timed out while queued is dropped

    async def _batch_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            if not batch:
                continue
            try:
                answers = await loop.run_in_executor(self._model_thread, self.predictor.run, batch)
            except Exception:  # a batch that fails is rerun one job at a time: only the culprit fails
                log.exception("a batch of %d failed; running its requests one at a time", len(batch))
                answers = [await self._run_alone(job) for job in batch]
            self.batches += 1
            self.batched += len(batch)
            if self.on_batch is not None:
                self.on_batch(len(batch))
            for job, answer in zip(batch, answers):
                if job.future.done():
                    continue
                if isinstance(answer, Exception):
                    job.future.set_exception(answer)
                else:
                    job.future.set_result(answer)

    async def _run_alone(self, job: Job) -> Answer | Exception:
        try:
            return (await asyncio.get_running_loop().run_in_executor(self._model_thread, self.predictor.run, [job]))[0]
        except Exception:
            log.exception("a request failed in the model")
            return RequestError(500, "internal", "the model failed on this image; the error is in the server's log")
