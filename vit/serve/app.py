"""`vit serve`'s HTTP front end (FastAPI): turns requests into `Service.answer` calls and errors into JSON.

    POST /predict   multipart (field ``file``) | raw body with Content-Type image/* |
                    JSON {"inputs": "<base64>", "parameters": {"top_k": 5}};  ?top_k=  ?attention=1
                    -> `vit predict`'s record {"path", "top_k": [{"class", "name", "probability"}], ...}
    POST /          the same requests (and a body with no Content-Type, as huggingface_hub sends bytes)
                    -> the Hugging Face image-classification task's [{"label", "score"}, ...], best first
                       (the model's top classes), its decision in the headers X-Answer and X-Unknown-Score
    GET  /          the page (page.html: no CDN, font or external script)
    GET  /openapi.json   the schema of both answers
    GET  /health    503 until the model is loaded and warmed up, then 200   (open even with an API key)
    GET  /livez     200 while the process runs                              (open even with an API key)
    GET  /info      model, classes, image settings, backend, attention, limits
    GET  /metrics   Prometheus: requests by status, latency, batch size, queue depth, in flight

Every error is ``{"detail": "...", "code": "..."}`` with its status (400 bad data, 401 no key, 405, 413 too
large, 415 wrong type, 422 bad parameter or too many pixels, 503 + Retry-After busy, 504 timeout), and
never a traceback. The body is counted as it arrives, so a lying Content-Length does not get past the limit.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from vit.serve.core import RequestError, Service
from vit.serve.schema import ERRORS, Label, Record, request_body

log = logging.getLogger(__name__)

OPEN_PATHS = ("/health", "/livez")  # answered without the API key: a load balancer's probes
API_KEY_HEADER = "X-API-Key"  # or Authorization: Bearer <key>, which huggingface_hub's clients send
ANSWER_HEADER, SCORE_HEADER = "X-Answer", "X-Unknown-Score"  # POST /'s decision (`answer_headers`)


def answers_image(scope) -> bool:
    """A POST that answers a prediction: /predict, or / (the Hugging Face task's route)."""
    return scope["method"] == "POST" and scope["path"] in ("/", "/predict")


def error_response(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The one shape of every error answer."""
    return JSONResponse({"detail": detail, "code": code}, status_code=status, headers=headers)


class Metrics:
    """The Prometheus series of one app, in a registry of its own (two apps in one process do not clash)."""

    def __init__(self, service: Service) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("vit_requests", "HTTP requests answered, by path and status",
                                ["path", "status"], registry=self.registry)
        self.latency = Histogram("vit_request_seconds", "time to answer a POST /predict or /", registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.batch_size = Histogram("vit_batch_size", "requests per model batch", registry=self.registry,
                                    buckets=(1, 2, 4, 8, 16, 32, 64))
        self.in_flight = Gauge("vit_in_flight", "HTTP requests being answered", registry=self.registry)
        queue = Gauge("vit_queue_depth", "decoded requests waiting for a batch", registry=self.registry)
        queue.set_function(lambda: service.queued)
        admitted = Gauge("vit_admitted", "/predict requests admitted and not yet answered", registry=self.registry)
        admitted.set_function(lambda: service.admitted)
        choice = getattr(service.predictor.classifier, "auto", None)  # --backend auto: what it chose, and how
        Info("vit_backend", "the engine running the model, and whether --backend auto chose it",
             registry=self.registry).info({"backend": service.predictor.backend,
                                           "chosen_by": "auto" if choice else "option",
                                           "cached": str(bool(choice and choice["cached"])).lower()})


class Guard:
    """ASGI middleware around everything: the API key, the in-flight gauge, requests counted by status."""

    def __init__(self, app, metrics: Metrics, api_key: str | None) -> None:
        self.app, self.metrics, self.api_key = app, metrics, api_key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, status = scope["path"], 500

        async def counting_send(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        started = time.perf_counter()
        self.metrics.in_flight.inc()
        try:
            is_open = path in OPEN_PATHS or (path == "/" and scope["method"] in ("GET", "HEAD"))  # the page
            if self.api_key is not None and not is_open and not self._has_key(scope):
                response = error_response(401, "unauthorized", f"this server needs an API key: send it in the "
                                          f"{API_KEY_HEADER} header")
                await response(scope, receive, counting_send)
            else:
                await self.app(scope, receive, counting_send)
        finally:
            self.metrics.in_flight.dec()
            known = path if path in ("/", "/predict", "/info", "/metrics", *OPEN_PATHS) else "other"
            self.metrics.requests.labels(known, str(status)).inc()
            if answers_image(scope):
                self.metrics.latency.observe(time.perf_counter() - started)

    def _has_key(self, scope) -> bool:
        headers, key = dict(scope["headers"]), self.api_key.encode()
        bearer = headers.get(b"authorization", b"")
        return hmac.compare_digest(headers.get(API_KEY_HEADER.lower().encode(), b""), key) or \
            hmac.compare_digest(bearer, b"Bearer " + key)


# ---- reading a /predict request ----------------------------------------------------------------
async def read_body(request: Request, limit: int) -> bytes:
    """The body, counted as it arrives: 413 as soon as it passes ``limit``, whatever Content-Length said."""
    too_large = RequestError(413, "too_large", f"the body is over this server's limit of {limit / 2**20:g} MB "
                             "(--max_body_mb)")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def parse_top_k(value: object, num_classes: int, *, clip: bool = False) -> int:
    """A top_k parameter (query string or JSON) as an int in 1..num_classes, or a 422 (``clip``: one over
    num_classes means all of them, as transformers' image-classification pipeline reads it)."""
    not_whole = RequestError(422, "bad_top_k", f"top_k must be a whole number, got {str(value)[:40]!r}")
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise not_whole
    try:
        k = int(value)  # a str: "--3", "²" and a 5,000-digit number raise ValueError here
    except ValueError:
        raise not_whole from None
    if clip and k > num_classes:
        return num_classes
    if not 1 <= k <= num_classes:
        raise RequestError(422, "bad_top_k", f"top_k must be between 1 and {num_classes} (the model's classes), "
                           f"got {k}")
    return k


def parse_flag(value: str | None, name: str) -> bool:
    """A query flag: 1/true/yes or 0/false/no (absent: false), or a 422."""
    if value is None:
        return False
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off", ""):
        return False
    raise RequestError(422, f"bad_{name}", f"{name} must be 1 or 0, got {value!r}")


async def from_multipart(request: Request, body: bytes) -> tuple[bytes, str]:
    """The ``file`` field of a multipart body (already read and counted) and its file name."""

    async def replay() -> dict:  # the counted bytes, handed to Starlette's parser as the request body
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_files=1, max_fields=16)
    except HTTPException as e:  # Starlette's parser reports a malformed body this way
        raise RequestError(400, "bad_multipart", f"malformed multipart body: {e.detail}") from None
    # a parameter's name is case-insensitive (RFC 2045): Boundary= is boundary=
    found = re.search(r'boundary=("?)([^";]*)\1', request.headers.get("content-type", ""), re.IGNORECASE)
    boundary = found.group(2) if found else ""
    if f"--{boundary}--".encode() not in body:  # the parser accepts a body cut short; RFC 2046 does not
        raise RequestError(400, "bad_multipart", "malformed multipart body: it does not end with its closing "
                           "boundary (was the upload cut short?)")
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise RequestError(422, "missing_field", "the multipart body has no file field named 'file' "
                           "(curl -F file=@photo.jpg)")
    return await upload.read(), upload.filename or "upload"


def from_json(body: bytes) -> tuple[bytes, dict]:
    """The image and parameters of ``{"inputs": "<base64>", "parameters": {...}}`` (the Hugging Face shape)."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, "bad_json", f"the body is not valid JSON ({e})") from None
    except RecursionError:  # json's parser recurses per nesting level: [[[[... 100,000 deep
        raise RequestError(400, "bad_json", "the body nests too deeply to be a request") from None
    if not isinstance(payload, dict) or "inputs" not in payload:
        raise RequestError(422, "missing_field", 'the JSON body needs "inputs": the image as base64')
    inputs, parameters = payload["inputs"], payload.get("parameters") or {}
    if not isinstance(inputs, str):
        raise RequestError(422, "bad_inputs", '"inputs" must be a base64 string of the image bytes')
    if not isinstance(parameters, dict):
        raise RequestError(422, "bad_parameters", '"parameters" must be an object, e.g. {"top_k": 5}')
    if inputs.lstrip().lower().startswith(("http://", "https://", "ftp://", "file:")):
        raise RequestError(422, "url_input", "this server does not fetch URLs: send the image bytes as base64")
    if inputs.startswith("data:") and "," in inputs:  # a data URL, as a browser's FileReader writes it
        inputs = inputs.split(",", 1)[1]
    try:
        data = base64.b64decode(inputs, validate=True)
    except (binascii.Error, ValueError) as e:
        raise RequestError(400, "bad_base64", f'"inputs" is not valid base64 ({e})') from None
    return data, parameters


async def read_image(request: Request, limit: int, *, untyped: bool = False) -> tuple[bytes, str, dict]:
    """(image bytes, name, JSON parameters) of a request in any of the three formats (``untyped``: a body with no
    Content-Type, or application/octet-stream, is the image too)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await read_body(request, limit)
    if not body:
        raise RequestError(400, "empty", "the request has no body: send an image (see GET / or the docs)")
    if content_type == "multipart/form-data":
        data, name = await from_multipart(request, body)
        return data, name, {}
    if content_type.startswith("image/") or (untyped and content_type in ("", "application/octet-stream")):
        return body, "upload", {}
    if content_type == "application/json":
        data, parameters = from_json(body)
        return data, "upload", parameters
    raise RequestError(415, "unsupported_type", f"Content-Type {content_type or '(none)'!r} is not accepted: "
                       "send multipart/form-data (field 'file'), image/*, or application/json")


# ---- the app -----------------------------------------------------------------------------------
def create_app(service: Service, *, api_key: str | None = None, cors_origins: list[str] | None = None,
               model_path: str = "") -> FastAPI:
    """The FastAPI app around ``service``; its lifespan warms the model up and stops the batcher."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        yield
        await service.stop()

    app = FastAPI(title="vit serve", lifespan=lifespan, docs_url=None, redoc_url=None,  # their pages load a CDN
                  openapi_url="/openapi.json")
    metrics = Metrics(service)
    service.on_batch = metrics.batch_size.observe
    add_error_handlers(app)
    add_status_routes(app, service, metrics, lambda: describe(service, api_key=api_key, model_path=model_path))
    add_predict_routes(app, service)
    app.add_middleware(Guard, metrics=metrics, api_key=api_key)
    if cors_origins:  # added last, so outermost: a browser's preflight (which carries no key) is answered
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type", API_KEY_HEADER],
                           expose_headers=[ANSWER_HEADER, SCORE_HEADER])  # a page's script may read the decision
    return app


def answer_headers(answer: dict) -> dict[str, str]:
    """The decision beside the Hugging Face task's list, which stays the model's top classes: ``X-Answer`` (the
    class or the unknown label; a multi-label model's labels, ";"-joined) and ``X-Unknown-Score``, each name
    percent-encoded (UTF-8), as HTTP headers carry Latin-1 alone."""
    if "labels" in answer:
        said = ";".join(quote(e["name"], safe="") for e in answer["labels"])
    else:
        said = quote(str(answer.get("answer", "")), safe="")
    headers = {ANSWER_HEADER: said}
    if answer.get("score") is not None:
        headers[SCORE_HEADER] = repr(float(answer["score"]))
    return headers


def add_error_handlers(app: FastAPI) -> None:
    """Every error as `error_response`'s JSON: ours, the router's 404 and 405, a bad parameter, and a bug (whose
    traceback goes to the log, never to the client)."""

    @app.exception_handler(RequestError)
    async def request_error(_: Request, e: RequestError) -> JSONResponse:
        return error_response(e.status, e.code, e.detail, e.headers)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException) -> JSONResponse:  # 404, 405 from the router
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        return error_response(e.status_code, code, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        return error_response(422, "bad_parameter", "; ".join(str(err.get("msg")) for err in e.errors()))

    @app.exception_handler(Exception)
    async def bug(_: Request, e: Exception) -> JSONResponse:
        log.exception("unexpected error")  # the traceback goes to the log, never to the client
        return error_response(500, "internal", "internal error; the details are in the server's log")


def describe(service: Service, *, api_key: str | None, model_path: str) -> dict:
    """GET /info's answer: the model, its classes and image settings, the backend, and the server's limits."""
    card, limits = service.predictor.classifier.card(), service.limits  # the card an export carries
    return {
        "model": card["model_name"], "path": model_path, "classes": card["class_names"],
        "image": {"size": card["img_size"], "channels": card["in_chans"], "mean": card["mean"], "std": card["std"],
                  "crop_pct": card["crop_pct"], "interpolation": card["interpolation"]},
        "backend": service.predictor.backend, "attention": service.predictor.attention,
        "backend_choice": getattr(service.predictor.classifier, "auto", None),  # --backend auto's measurements
        "calibration": calibration.to_dict() if (calibration := getattr(service.predictor.classifier,
                                                                          "calibration", None)) else None,
        "api_key": api_key is not None,
        "limits": {"max_batch_size": limits.max_batch_size, "batch_timeout_ms": limits.batch_timeout_ms,
                   "max_queue": limits.max_queue, "timeout_s": limits.timeout_s,
                   "max_body_mb": limits.max_body_mb, "max_pixels": limits.max_pixels,
                   "top_k": limits.top_k},
    }


def add_status_routes(app: FastAPI, service: Service, metrics: Metrics, info: Callable[[], dict]) -> None:
    """GET /, /livez, /health, /info (``info()``'s answer) and /metrics."""
    page = resources.files("vit.serve").joinpath("page.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/livez")
    async def livez() -> dict:
        return {"status": "alive"}

    @app.get("/health")
    async def health() -> JSONResponse:
        if not service.ready:
            return error_response(503, "not_ready", "loading the model", {"Retry-After": "1"})
        return JSONResponse({"status": "ok"})

    @app.get("/info", name="info")
    async def get_info() -> dict:
        return info()

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


def add_predict_routes(app: FastAPI, service: Service) -> None:
    """POST /predict (the record) and POST / (the Hugging Face task's list): the URL alone picks the answer's
    shape, whatever the body's format; ``top_k`` comes from the query or the JSON parameters."""
    num_classes = len(service.predictor.classifier.class_names)

    def top_k_of(request: Request, parameters: dict, *, clip: bool) -> int | None:
        query = request.query_params
        top_k = parse_top_k(query["top_k"], num_classes, clip=clip) if "top_k" in query else None
        return parse_top_k(parameters["top_k"], num_classes, clip=clip) if "top_k" in parameters else top_k

    @app.post("/predict", response_model=Record, responses=ERRORS, openapi_extra=request_body(untyped=False),
              summary="`vit predict`'s record for one image")
    async def predict(request: Request) -> JSONResponse:
        attention = parse_flag(request.query_params.get("attention"), "attention")
        data, name, parameters = await read_image(request, service.limits.max_body_bytes)
        top_k = top_k_of(request, parameters, clip=False)
        return JSONResponse(await service.answer(data, top_k=top_k, attention=attention, name=name))

    @app.post("/", response_model=list[Label], responses=ERRORS, openapi_extra=request_body(untyped=True),
              summary="the Hugging Face image-classification task: [{label, score}], best first")
    async def classify(request: Request) -> JSONResponse:
        if "attention" in request.query_params:
            raise RequestError(422, "bad_attention", "POST / answers the Hugging Face task's labels and scores; "
                               "ask POST /predict?attention=1 for the attention map")
        data, _, parameters = await read_image(request, service.limits.max_body_bytes, untyped=True)
        top_k = top_k_of(request, parameters, clip=True)
        function = parameters.get("function_to_apply")
        if function not in (None, "softmax"):
            raise RequestError(422, "bad_function_to_apply", f"function_to_apply {str(function)[:40]!r} is not "
                               "served: the scores are the softmax (send 'softmax' or leave it out)")
        answer = await service.answer(data, top_k=top_k)
        labels = [{"label": e["name"], "score": e["probability"]} for e in answer["top_k"]]
        return JSONResponse(labels, headers=answer_headers(answer))
