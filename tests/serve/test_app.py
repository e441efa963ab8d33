"""`vit serve`'s app in-process (httpx's ASGI transport): the three request formats give `vit predict`'s
records, every bad input gets its own 4xx without costing anyone else their answer, and the limits,
key, CORS, attention and metrics behave as documented."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
import time

import pytest
from PIL import Image

from tests.serve.conftest import client_of, huge_png, make_app, png_bytes
from vit.deploy.predict import predict_files
from vit.serve.app import parse_flag, parse_top_k
from vit.serve.core import Predictor, RequestError


def run(coroutine):
    """Run a test's coroutine to its end (no pytest plugin needed)."""
    return asyncio.run(coroutine)


def multipart(data: bytes, name: str = "x.png") -> dict:
    return {"files": {"file": (name, data, "application/octet-stream")}}


def formats(data: bytes, name: str) -> dict[str, dict]:
    """One image in each of the three request formats, as httpx keyword arguments."""
    return {
        "multipart": multipart(data, name),
        "raw": {"content": data, "headers": {"Content-Type": "image/png"}},
        "json": {"json": {"inputs": base64.b64encode(data).decode(), "parameters": {"top_k": 5}}},
    }


def assert_same_top_k(answer: list[dict], expected: list[dict], tol: float) -> None:
    assert [e["class"] for e in answer] == [e["class"] for e in expected]
    assert [e["name"] for e in answer] == [e["name"] for e in expected]
    for a, e in zip(answer, expected):
        assert abs(a["probability"] - e["probability"]) <= tol, (answer, expected)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_every_format_answers_what_vit_predict_writes(backend, predictor, onnx_predictor, digit_bytes, odd_images):
    chosen: Predictor = predictor if backend == "torch" else onnx_predictor
    files = [path for path, _ in digit_bytes] + list(odd_images.values())
    expected = predict_files(chosen.classifier, files, top_k=5)

    async def go():
        async with client_of(make_app(chosen)) as client:
            for path, want in zip(files, expected):
                for kind, kwargs in formats(path.read_bytes(), path.name).items():
                    response = await client.post("/predict", **kwargs)
                    assert response.status_code == 200, (path.name, kind, response.text)
                    body = response.json()
                    assert body["error"] is None and set(body["timing_ms"]) == {"decode", "queue", "inference", "total"}
                    # onnxruntime's batch of one and of 64 agree to the last digit of a record; torch's within 1e-5
                    assert_same_top_k(body["top_k"], want["top_k"], 0 if backend == "onnx" else 1e-5)
                    assert body["path"] == (path.name if kind == "multipart" else "upload")
    run(go())


def test_health_is_503_until_the_warm_up_batch_has_run(predictor):
    async def go():
        app = make_app(predictor)
        async with client_of(app, lifespan=False) as cold:
            response = await cold.get("/health")
            assert response.status_code == 503 and response.headers["Retry-After"] == "1"
            assert response.json()["code"] == "not_ready"
            assert (await cold.get("/livez")).status_code == 200
            assert (await cold.post("/predict", content=b"x", headers={"Content-Type": "image/png"})).status_code == 503
        async with client_of(app) as warm:
            assert (await warm.get("/health")).json() == {"status": "ok"}
    run(go())


# ---- bad inputs ------------------------------------------------------------------------------
TEXT = b"just some words, not pixels\n"
HEIC = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(64)  # an iPhone photo's first bytes


def jpeg() -> bytes:
    return png_bytes(Image.new("RGB", (64, 64), (30, 90, 200)), format="JPEG")


async def chunks(parts: list[bytes]):
    """A request body sent in chunks, without a Content-Length."""
    for part in parts:
        yield part


BAD = {  # name -> (request kwargs as a function of the limit, status, code)
    "empty body": (lambda: {"content": b"", "headers": {"Content-Type": "image/png"}}, 400, "empty"),
    "missing field": (lambda: {"files": {"image": ("x.png", b"abc")}}, 422, "missing_field"),
    "text file named .jpg": (lambda: multipart(TEXT, "photo.jpg"), 415, "unsupported_image"),
    "an iPhone's HEIC photo": (lambda: multipart(HEIC, "IMG_0001.HEIC"), 415, "unsupported_image"),
    "truncated JPEG": (lambda: multipart(jpeg()[:300], "cut.jpg"), 400, "bad_image"),
    "0-byte file": (lambda: multipart(b"", "empty.png"), 400, "empty"),
    "over the limit, true length": (
        lambda: {"content": b"\0" * (2**20 + 1), "headers": {"Content-Type": "image/png"}}, 413, "too_large"),
    "over the limit, lying length": (
        lambda: {"content": b"\0" * (2**20 + 1), "headers": {"Content-Type": "image/png", "Content-Length": "10"}},
        413, "too_large"),
    "over the limit, no length (chunked)": (
        lambda: {"content": chunks([b"\0" * 2**19] * 3), "headers": {"Content-Type": "image/png"}}, 413, "too_large"),
    "20000x20000 PNG": (lambda: {"content": huge_png(), "headers": {"Content-Type": "image/png"}},
                        422, "too_many_pixels"),
    "invalid base64": (lambda: {"json": {"inputs": "not base64 at all!"}}, 400, "bad_base64"),
    "malformed JSON": (lambda: {"content": b'{"inputs": ', "headers": {"Content-Type": "application/json"}},
                       400, "bad_json"),
    "JSON without inputs": (lambda: {"json": {"image": "abc"}}, 422, "missing_field"),
    "top_k 0": (lambda: {"json": {"inputs": GOOD_B64, "parameters": {"top_k": 0}}}, 422, "bad_top_k"),
    "top_k -1": (lambda: {"json": {"inputs": GOOD_B64, "parameters": {"top_k": -1}}}, 422, "bad_top_k"),
    "top_k 1e9": (lambda: {"json": {"inputs": GOOD_B64, "parameters": {"top_k": 10**9}}}, 422, "bad_top_k"),
    "top_k abc": (lambda: {"json": {"inputs": GOOD_B64, "parameters": {"top_k": "abc"}}}, 422, "bad_top_k"),
    "?top_k=abc": (lambda: {**multipart(GOOD), "params": {"top_k": "abc"}}, 422, "bad_top_k"),
    "?top_k=0": (lambda: {**multipart(GOOD), "params": {"top_k": "0"}}, 422, "bad_top_k"),
    "?top_k=--3": (lambda: {**multipart(GOOD), "params": {"top_k": "--3"}}, 422, "bad_top_k"),
    "?top_k=²": (lambda: {**multipart(GOOD), "params": {"top_k": "²"}}, 422, "bad_top_k"),
    "?top_k= of 5,000 digits": (lambda: {**multipart(GOOD), "params": {"top_k": "9" * 5000}}, 422, "bad_top_k"),
    "JSON nested 100,000 deep": (lambda: {"content": b"[" * 100_000, "headers": {"Content-Type": "application/json"}},
                                 400, "bad_json"),
    "a 4 kB PNG of 4,000,000 x 1 pixels": (
        lambda: {"content": huge_png(4_000_000, 1), "headers": {"Content-Type": "image/png"}}, 422, "too_many_pixels"),
    "a URL as input": (lambda: {"json": {"inputs": "https://example.com/cat.jpg"}}, 422, "url_input"),
    "wrong content type": (lambda: {"content": TEXT, "headers": {"Content-Type": "text/plain"}},
                           415, "unsupported_type"),
    "malformed multipart": (
        lambda: {"content": b"--XYZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc",
                 "headers": {"Content-Type": "multipart/form-data; boundary=XYZ"}}, 400, "bad_multipart"),
    "multipart without a boundary": (
        lambda: {"content": b"abc", "headers": {"Content-Type": "multipart/form-data"}}, 400, "bad_multipart"),
    "?attention=maybe": (lambda: {**multipart(GOOD), "params": {"attention": "maybe"}}, 422, "bad_attention"),
}
GOOD = png_bytes(Image.new("L", (8, 8), 128))
GOOD_B64 = base64.b64encode(GOOD).decode()


def test_each_bad_input_gets_its_own_4xx_with_a_detail_and_the_next_request_succeeds(predictor):
    async def go():
        async with client_of(make_app(predictor, max_body_mb=1)) as client:
            for name, (request, status, code) in BAD.items():
                started = time.perf_counter()
                response = await client.post("/predict", **request())
                elapsed = time.perf_counter() - started
                assert response.status_code == status, (name, response.text)
                body = response.json()
                assert body["code"] == code and body["detail"], (name, body)
                assert "Traceback" not in response.text and "File \"" not in response.text
                assert elapsed < 1.0, f"{name}: answered in {elapsed:.2f} s"
                after = await client.post("/predict", **multipart(GOOD))
                assert after.status_code == 200, (name, after.text)
            response = await client.get("/predict")  # GET where only POST is served
            assert response.status_code == 405 and response.json()["code"] == "method_not_allowed"
            assert (await client.get("/nowhere")).json()["code"] == "not_found"
    run(go())


def test_the_pixel_limit_is_read_from_the_header_before_decoding(predictor):
    """A huge header over garbage pixels is still a 422 (pixels), not a 400 (decoding failed): nothing is decoded.
    8000x8000 is caught by --max_pixels (40 MP), 20000x20000 already by PIL's own guard in Image.open."""
    async def go():
        async with client_of(make_app(predictor)) as client:
            for side, words in [(8000, "64,000,000 pixels"), (20000, "400,000,000 pixels")]:
                real = huge_png(side, side)
                fake = real[:33] + b"\0\0\0\x04IDAT" + b"junk" + real[-12:]  # its IHDR, 4 bad IDAT bytes, IEND
                for data in (real, fake):
                    response = await client.post("/predict", content=data, headers={"Content-Type": "image/png"})
                    assert response.status_code == 422, response.text
                    assert words in response.json()["detail"] and "--max_pixels" in response.json()["detail"]
    run(go())


def test_an_elongated_image_is_refused_before_resizing_makes_it_huge(predictor):
    """Under --max_pixels as sent, but the eval transform scales the short side up to the model's before it crops:
    4,000,000 x 1 would become 16 x 64,000,000 pixels (3 GB) for this 8x8 model. A strip that stays small passes."""
    short_side = predictor.short_side
    resize = predictor.transform.transforms[0]  # timm's eval transform: resize, centre crop, to tensor, normalise
    assert min(resize(Image.new("L", (40, 2))).size) == short_side == 16  # the digits model's
    async def go():
        async with client_of(make_app(predictor)) as client:
            response = await client.post("/predict", content=huge_png(4_000_000, 1),
                                         headers={"Content-Type": "image/png"})
            assert response.status_code == 422, response.text
            resized = 4_000_000 * short_side * short_side  # the long side scaled as the short one, times the short
            assert f"would make it {resized:,} pixels" in response.json()["detail"]
            strip = png_bytes(Image.new("L", (2000, 1), 128))  # 2000 x 16 once resized: fine
            assert (await client.post("/predict", **multipart(strip))).status_code == 200
    run(go())


def test_a_multipart_boundary_parameter_of_any_case_is_read(predictor):
    """Parameter names are case-insensitive (RFC 2045): `Boundary=` is the boundary, and the upload answered."""
    body = (b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.png\"\r\n"
            b"Content-Type: image/png\r\n\r\n" + GOOD + b"\r\n--XyZ--\r\n")
    async def go():
        async with client_of(make_app(predictor)) as client:
            for header in ("boundary=XyZ", "Boundary=XyZ", 'BOUNDARY="XyZ"'):
                response = await client.post("/predict", content=body,
                                             headers={"Content-Type": f"multipart/form-data; {header}"})
                assert response.status_code == 200, (header, response.text)
    run(go())


def test_odd_but_valid_images_get_200(predictor, odd_images):
    async def go():
        async with client_of(make_app(predictor)) as client:
            for name, path in odd_images.items():
                response = await client.post("/predict", **multipart(path.read_bytes(), name))
                assert response.status_code == 200, (name, response.text)
                assert len(response.json()["top_k"]) == 5
    run(go())


# ---- batching: bad input never costs anyone else their answer --------------------------------
def test_one_bad_and_seven_good_requests_in_one_batch_window_give_seven_200s(predictor, digit_bytes):
    goods = [data for _, data in digit_bytes[:7]]

    async def go():
        app = make_app(predictor, max_batch_size=8, batch_timeout_ms=300)
        async with client_of(app) as client:
            requests = [client.post("/predict", **multipart(d)) for d in goods[:3]]
            requests.append(client.post("/predict", **multipart(TEXT, "notes.jpg")))
            requests += [client.post("/predict", **multipart(d)) for d in goods[3:]]
            responses = await asyncio.gather(*requests)
        statuses = [r.status_code for r in responses]
        assert statuses == [200, 200, 200, 415, 200, 200, 200, 200]
        sizes = {r.json()["batch_size"] for r in responses if r.status_code == 200}
        assert sizes == {7}, f"the seven good requests should share one batch, got batch sizes {sizes}"
    run(go())


class FailsOnTopK3(Predictor):
    """A model that fails on any batch holding a request for top_k=3 (as a NaN-producing image might)."""

    def __init__(self, inner: Predictor) -> None:
        self.__dict__.update(inner.__dict__)

    def run(self, jobs):
        if any(job.top_k == 3 for job in jobs):
            raise RuntimeError("boom")
        return super().run(jobs)


def test_a_batch_that_fails_in_the_model_fails_only_its_culprit(predictor):
    async def go():
        app = make_app(FailsOnTopK3(predictor), max_batch_size=8, batch_timeout_ms=300)
        async with client_of(app) as client:
            ks = [5, 5, 3, 5, 5]
            responses = await asyncio.gather(*(client.post("/predict", **multipart(GOOD), params={"top_k": k})
                                               for k in ks))
        assert [r.status_code for r in responses] == [200, 200, 500, 200, 200]
        assert responses[2].json()["code"] == "internal" and "boom" not in responses[2].text
    run(go())


class Slow(Predictor):
    """The real model, ``delay`` seconds slower per batch."""

    def __init__(self, inner: Predictor, delay: float) -> None:
        self.__dict__.update(inner.__dict__)
        self.delay = delay

    def run(self, jobs):
        time.sleep(self.delay)
        return super().run(jobs)


def test_a_full_queue_answers_503_with_retry_after_and_recovers(predictor):
    async def go():
        app = make_app(Slow(predictor, 0.2), max_batch_size=2, max_queue=4, batch_timeout_ms=1)
        async with client_of(app) as client:
            responses = await asyncio.gather(*(client.post("/predict", **multipart(GOOD)) for _ in range(12)))
            statuses = sorted(r.status_code for r in responses)
            assert set(statuses) == {200, 503} and statuses.count(200) >= 4, statuses
            busy = next(r for r in responses if r.status_code == 503)
            assert busy.headers["Retry-After"] == "1" and busy.json()["code"] == "queue_full"
            assert (await client.get("/health")).status_code == 200
            assert (await client.post("/predict", **multipart(GOOD))).status_code == 200
    run(go())


def test_a_lone_request_does_not_wait_out_the_batch_timeout(predictor):
    # The other side of the seven-in-one-batch test: with no other request admitted, no company can come, so a
    # lone request is batched at once, not after batch_timeout_ms (2 s here).
    async def go():
        app = make_app(predictor, max_batch_size=8, batch_timeout_ms=2000)
        async with client_of(app) as client:
            response = await client.post("/predict", **multipart(GOOD))
        assert response.status_code == 200 and response.json()["batch_size"] == 1
        assert response.json()["timing_ms"]["queue"] < 200, response.json()["timing_ms"]
    run(go())


class Blocked(Predictor):
    """The real model, whose requests' batches wait until ``release`` is set (the warm-up's do not)."""

    def __init__(self, inner: Predictor) -> None:
        self.__dict__.update(inner.__dict__)
        self.release = threading.Event()

    def run(self, jobs):
        if any(job.future is not None for job in jobs):
            self.release.wait(20)
        return super().run(jobs)


def test_max_queue_admits_exactly_that_many(predictor):
    # max_queue 4 and 6 requests at once while the model is stuck: 4 admitted (the gauge), exactly 2 turned away.
    async def go():
        blocked = Blocked(predictor)
        app = make_app(blocked, max_batch_size=2, max_queue=4, batch_timeout_ms=1)
        async with client_of(app) as client:
            try:
                posts = [asyncio.ensure_future(client.post("/predict", **multipart(GOOD))) for _ in range(6)]
                deadline = time.monotonic() + 10
                while True:  # until every request is either answered or admitted
                    metrics = (await client.get("/metrics")).text
                    admitted = float(next(line.split()[1] for line in metrics.splitlines()
                                          if line.startswith("vit_admitted ")))
                    answered = [p.result().status_code for p in posts if p.done()]
                    if admitted + len(answered) == 6 or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.02)
                assert (admitted, answered) == (4, [503, 503]), (admitted, answered)
            finally:
                blocked.release.set()
            assert [r.status_code for r in await asyncio.gather(*posts)].count(200) == 4
    run(go())


def test_a_request_past_the_timeout_gets_504(predictor):
    async def go():
        app = make_app(Slow(predictor, 0.6), timeout_s=0.2)
        async with client_of(app) as client:
            response = await client.post("/predict", **multipart(GOOD))
            assert response.status_code == 504 and response.json()["code"] == "timeout"
    run(go())


# ---- key, CORS, attention, info, metrics, page -----------------------------------------------
def test_an_api_key_is_needed_everywhere_but_health_livez_and_the_page(predictor):
    async def go():
        async with client_of(make_app(predictor, api_key="s3cret")) as client:
            for method, path in [("post", "/predict"), ("get", "/info"), ("get", "/metrics")]:
                response = await getattr(client, method)(path)
                assert response.status_code == 401 and response.json()["code"] == "unauthorized", path
                wrong = await getattr(client, method)(path, headers={"X-API-Key": "guess"})
                assert wrong.status_code == 401
            for path in ["/health", "/livez", "/"]:
                assert (await client.get(path)).status_code == 200, path
            ok = await client.post("/predict", **multipart(GOOD), headers={"X-API-Key": "s3cret"})
            assert ok.status_code == 200
            assert (await client.get("/info", headers={"X-API-Key": "s3cret"})).json()["api_key"] is True
    run(go())


def test_no_cors_header_unless_an_origin_is_given(predictor):
    async def go():
        origin = {"Origin": "https://app.example.com"}
        async with client_of(make_app(predictor)) as client:
            response = await client.post("/predict", **multipart(GOOD), headers=origin)
            assert response.status_code == 200
            assert not any(h.lower().startswith("access-control-") for h in response.headers)
        async with client_of(make_app(predictor, cors_origins=["https://app.example.com"])) as client:
            response = await client.post("/predict", **multipart(GOOD), headers=origin)
            assert response.headers["access-control-allow-origin"] == "https://app.example.com"
            other = await client.post("/predict", **multipart(GOOD), headers={"Origin": "https://evil.example"})
            assert "access-control-allow-origin" not in other.headers
    run(go())


def test_attention_overlay_for_a_checkpoint_and_422_for_onnx(predictor, onnx_predictor, digit_bytes):
    data = digit_bytes[0][1]

    async def go():
        async with client_of(make_app(predictor)) as client:
            assert (await client.get("/info")).json()["attention"] is True
            response = await client.post("/predict", **multipart(data), params={"attention": "1"})
            plain = await client.post("/predict", **multipart(data))
        assert response.status_code == 200 and "attention_png" not in plain.json()
        assert response.json()["top_k"] == plain.json()["top_k"]
        overlay = Image.open(io.BytesIO(base64.b64decode(response.json()["attention_png"])))
        assert overlay.format == "PNG" and overlay.mode == "RGB" and min(overlay.size) >= 224
        async with client_of(make_app(onnx_predictor)) as client:
            info = (await client.get("/info")).json()
            refused = await client.post("/predict", **multipart(data), params={"attention": "1"})
        assert info["attention"] is False and info["backend"] == "onnxruntime"
        assert refused.status_code == 422 and "checkpoint" in refused.json()["detail"]
    run(go())


def test_a_backend_engine_names_itself_and_refuses_attention_maps(checkpoint, digit_bytes):
    """`vit serve --backend torch-bf16` (or compile, openvino): /info names the engine, and ?attention=1 is a 422
    that says why (rollout reads the eager fp32 model), not an error from inside a bf16 model."""
    from vit.deploy import load_classifier
    from vit.deploy.backends import Bf16Classifier
    from vit.serve.core import Predictor

    data = digit_bytes[0][1]

    async def go():
        async with client_of(make_app(Predictor(Bf16Classifier(load_classifier(checkpoint))))) as client:
            info = (await client.get("/info")).json()
            refused = await client.post("/predict", **multipart(data), params={"attention": "1"})
            plain = await client.post("/predict", **multipart(data))
        assert info["backend"] == "torch-bf16 (cpu)" and info["attention"] is False
        assert refused.status_code == 422 and "--backend torch" in refused.json()["detail"]
        assert "torch-bf16" in refused.json()["detail"] and plain.status_code == 200
    run(go())


def test_info_metrics_and_page(predictor):
    async def go():
        async with client_of(make_app(predictor, max_batch_size=4)) as client:
            info = (await client.get("/info")).json()
            await client.post("/predict", **multipart(GOOD))
            await client.post("/predict", **multipart(TEXT))
            metrics = (await client.get("/metrics")).text
            page = await client.get("/")
        classifier = predictor.classifier
        assert info["classes"] == classifier.class_names and info["image"]["size"] == list(classifier.img_size)
        assert info["limits"]["max_batch_size"] == 4 and info["backend"] == "torch (cpu)"
        assert 'vit_requests_total{path="/predict",status="200"} 1.0' in metrics
        assert 'vit_requests_total{path="/predict",status="415"} 1.0' in metrics
        assert "vit_batch_size_count 1.0" in metrics and "vit_request_seconds_count 2.0" in metrics
        assert "vit_queue_depth 0.0" in metrics and "vit_in_flight 1.0" in metrics  # the /metrics request itself
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        for needed in ('data-testid="dropzone"', 'data-testid="file-input"', 'data-testid="topk"',
                       'data-testid="attention-toggle"', 'data-testid="error"', 'data-testid="preview"'):
            assert needed in page.text
        # nothing from elsewhere: no absolute URL in src/href, no @import, no font files
        assert "http://" not in page.text and "https://" not in page.text and "@import" not in page.text
    run(go())


def test_json_parameters_and_query_top_k(predictor, digit_bytes):
    data = digit_bytes[1][1]

    async def go():
        async with client_of(make_app(predictor, top_k=3)) as client:
            default = (await client.post("/predict", **multipart(data))).json()
            query = (await client.post("/predict", **multipart(data), params={"top_k": "2"})).json()
            body = {"inputs": "data:image/png;base64," + base64.b64encode(data).decode(), "parameters": {"top_k": 4}}
            data_url = (await client.post("/predict", content=json.dumps(body),
                                          headers={"Content-Type": "application/json"})).json()
        assert [len(a["top_k"]) for a in (default, query, data_url)] == [3, 2, 4]
        assert query["top_k"] == default["top_k"][:2] and data_url["top_k"][:3] == default["top_k"]
    run(go())


@pytest.mark.parametrize(("value", "clip", "expected"), [
    (1, False, 1), ("5", False, 5), (5, False, 5), (6, True, 5), ("99", True, 5),
])
def test_parse_top_k_takes_1_to_the_classes(value, clip, expected):
    assert parse_top_k(value, 5, clip=clip) == expected


@pytest.mark.parametrize("value", [0, 6, "0", "-1", True, 2.0, "²", "--3", None])
def test_parse_top_k_answers_422_outside_1_to_the_classes(value):
    with pytest.raises(RequestError) as caught:
        parse_top_k(value, 5)
    assert (caught.value.status, caught.value.code) == (422, "bad_top_k")


def test_parse_flag_reads_yes_and_no_and_refuses_the_rest():
    assert [parse_flag(v, "attention") for v in ("1", "TRUE", "yes", "on")] == [True] * 4
    assert [parse_flag(v, "attention") for v in (None, "0", "False", "no", "off", "")] == [False] * 6
    with pytest.raises(RequestError) as caught:
        parse_flag("2", "attention")
    assert (caught.value.status, caught.value.code) == (422, "bad_attention")


def test_auto_shows_its_choice_in_info_and_metrics(checkpoint, tmp_path):
    """`vit serve --backend auto`: /info carries the measurements and the choice, /metrics the engine and that auto
    chose it; a backend given by name says so too."""
    import shutil

    from vit.deploy import load_classifier
    from vit.deploy.backends import load_auto
    from vit.serve.core import Predictor

    ckpt = tmp_path / "model.ckpt"
    shutil.copy(checkpoint, ckpt)
    # two candidates in a few seconds: what is shown is under test here, the choice in tests/deploy/test_auto.py
    model = load_auto(ckpt, batch_size=4, threads=1, names=["torch", "onnx"], budget_s=4)

    async def go():
        async with client_of(make_app(Predictor(model))) as client:
            info = (await client.get("/info")).json()
            metrics = (await client.get("/metrics")).text
        chosen = info["backend_choice"]["backend"]
        assert set(info["backend_choice"]["results"]) >= {"torch", chosen} and not info["backend_choice"]["cached"]
        assert info["backend"].split(" ")[0] == {"onnx": "onnxruntime"}.get(chosen, chosen)
        assert f'vit_backend_info{{backend="{info["backend"]}",cached="false",chosen_by="auto"}} 1.0' in metrics
        async with client_of(make_app(Predictor(load_classifier(checkpoint)))) as client:
            info = (await client.get("/info")).json()
            metrics = (await client.get("/metrics")).text
        assert info["backend_choice"] is None
        assert 'vit_backend_info{backend="torch (cpu)",cached="false",chosen_by="option"} 1.0' in metrics
    run(go())
