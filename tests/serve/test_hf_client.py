"""Clients no one here wrote talk to `vit serve`: huggingface_hub's InferenceClient on the root URL gets the
Hugging Face image-classification task's labels and scores, equal to `vit predict`'s; /predict keeps the record;
and the OpenAPI schema states both answers (what a generated client is built from)."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from PIL import Image

from tests.serve.conftest import client_of, make_app, png_bytes, serving
from vit.deploy import load_classifier
from vit.deploy.predict import predict_files

KEY = "s3cret"


def as_pairs(entries: list[dict]) -> list[tuple[str, float]]:
    """`vit predict`'s top-k entries as (label, score)."""
    return [(e["name"], e["probability"]) for e in entries]


def assert_same(got, expected: list[tuple[str, float]]) -> None:
    assert [g.label for g in got] == [label for label, _ in expected]
    assert max(abs(g.score - score) for g, (_, score) in zip(got, expected)) <= 1e-4, (got, expected)


def test_huggingface_hubs_inference_client_gets_vit_predicts_labels_and_scores(checkpoint, digit_pngs, monkeypatch):
    from huggingface_hub import constants

    # tests/conftest.py sets HF_HUB_OFFLINE=1, under which the client refuses every URL, 127.0.0.1 included
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    files = digit_pngs[0][:6]
    num_classes = len(load_classifier(checkpoint).class_names)
    expected = [as_pairs(r["top_k"]) for r in predict_files(load_classifier(checkpoint), files, top_k=num_classes)]
    with serving(checkpoint, "--api_key_env", "VIT_TEST_KEY", VIT_TEST_KEY=KEY) as (url, _):
        client = InferenceClient(model=url, api_key=KEY)  # sends the key as Authorization: Bearer
        for path, want in zip(files, expected):
            assert_same(client.image_classification(str(path)), want[:5])  # raw PNG body; the default top_k is 5
            assert_same(client.image_classification(str(path), top_k=3), want[:3])  # JSON with base64 and parameters
            assert_same(client.image_classification(path.read_bytes(), top_k=1), want[:1])
        # bytes without parameters go as a body with no Content-Type; top_k over the classes means all of them
        assert_same(client.image_classification(files[0].read_bytes()), expected[0][:5])
        assert_same(client.image_classification(str(files[0]), top_k=num_classes + 7), expected[0])
        with_header = InferenceClient(model=url, headers={"X-API-Key": KEY})
        assert_same(with_header.image_classification(str(files[1]), top_k=2), expected[1][:2])
        with pytest.raises(HfHubHTTPError, match="401"):
            InferenceClient(model=url, api_key="guess").image_classification(str(files[0]))
        # /predict answers the record, to the page and to every existing client, whatever the request's format
        body = {"inputs": base64.b64encode(files[0].read_bytes()).decode(), "parameters": {"top_k": 3}}
        record = httpx.post(f"{url}/predict", headers={"X-API-Key": KEY}, json=body)
        assert as_pairs(record.json()["top_k"]) == expected[0][:3] and record.json()["path"] == "upload"
        with pytest.raises(ValueError, match="Expected a list"):  # so the task's client is pointed at the root
            InferenceClient(model=f"{url}/predict", api_key=KEY).image_classification(str(files[0]))
        page = httpx.get(url)  # the page still opens without the key
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_the_task_route_refuses_what_it_does_not_serve_and_keeps_every_check(predictor):
    good = png_bytes(Image.new("L", (8, 8), 128))
    b64 = base64.b64encode(good).decode()

    async def go():
        async with client_of(make_app(predictor)) as client:
            answers = {
                "sigmoid": await client.post("/", json={"inputs": b64, "parameters": {"function_to_apply": "sigmoid"}}),
                "softmax": await client.post("/", json={"inputs": b64, "parameters": {"function_to_apply": "softmax"}}),
                "attention": await client.post("/", content=good, params={"attention": "1"}),
                "top_k 0": await client.post("/", json={"inputs": b64, "parameters": {"top_k": 0}}),
                "text, untyped": await client.post("/", content=b"just words"),
                "text/plain": await client.post("/", content=good, headers={"Content-Type": "text/plain"}),
                "untyped on /predict": await client.post("/predict", content=good),
                "octet-stream": await client.post("/", content=good,
                                                  headers={"Content-Type": "application/octet-stream"}),
            }
        return {name: (r.status_code, r.json()) for name, r in answers.items()}

    got = asyncio.run(go())
    assert got["sigmoid"][0] == 422 and got["sigmoid"][1]["code"] == "bad_function_to_apply"
    assert got["softmax"][0] == 200 and [set(e) for e in got["softmax"][1]] == [{"label", "score"}] * 5
    assert got["attention"][0] == 422 and "/predict?attention=1" in got["attention"][1]["detail"]
    assert got["top_k 0"][1]["code"] == "bad_top_k"
    assert got["text, untyped"][1]["code"] == "unsupported_image"  # read as an image, and refused as one
    assert got["text/plain"][1]["code"] == "unsupported_type"
    assert got["untyped on /predict"][1]["code"] == "unsupported_type"  # /predict's rules are unchanged
    assert got["octet-stream"][0] == 200 and got["octet-stream"][1] == got["softmax"][1]
