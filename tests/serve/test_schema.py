"""FastAPI's OpenAPI schema of `vit serve` (`vit.serve.schema`) states both answers: the record of /predict and
the Hugging Face task's list of POST / (what a generated client is built from)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from tests.serve.conftest import client_of, make_app
from vit.serve.schema import ERRORS, Record, request_body


def test_the_openapi_schema_states_both_answers(predictor):
    async def go():
        async with client_of(make_app(predictor), lifespan=False) as client:
            return (await client.get("/openapi.json")).json()

    schema = asyncio.run(go())
    task, predict = schema["paths"]["/"]["post"], schema["paths"]["/predict"]["post"]
    assert "get" not in schema["paths"]["/"]  # the page is not an API
    task_answer = task["responses"]["200"]["content"]["application/json"]["schema"]
    assert task_answer["type"] == "array" and task_answer["items"] == {"$ref": "#/components/schemas/Label"}
    assert predict["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Record"}
    components = schema["components"]["schemas"]
    assert set(components["Label"]["required"]) == {"label", "score"}
    assert set(components["Entry"]["properties"]) == {"class", "name", "probability"}
    assert {"path", "top_k", "error", "batch_size", "timing_ms"} <= set(components["Record"]["required"])
    for route in (task, predict):
        assert route["responses"]["422"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"}
        assert {"image/*", "application/json", "multipart/form-data"} <= set(route["requestBody"]["content"])
    assert "application/octet-stream" in task["requestBody"]["content"]
    assert "application/octet-stream" not in predict["requestBody"]["content"]


def test_request_body_reads_untyped_bytes_only_where_asked():
    typed = request_body(untyped=False)["requestBody"]
    assert typed["required"] is True
    assert sorted(typed["content"]) == ["application/json", "image/*", "multipart/form-data"]
    untyped = request_body(untyped=True)["requestBody"]["content"]
    assert sorted(untyped) == ["application/json", "application/octet-stream", "image/*", "multipart/form-data"]
    assert untyped["application/octet-stream"] == {"schema": {"type": "string", "format": "binary"}}


def test_a_record_reads_class_as_its_entries_index_and_needs_its_fields():
    answer = {"path": "cat.jpg", "top_k": [{"class": 3, "name": "cat", "probability": 0.5}], "error": None,
              "batch_size": 2, "timing_ms": {"total": 1.5}}
    record = Record.model_validate(answer)
    assert (record.top_k[0].index, record.top_k[0].name, record.labels) == (3, "cat", None)
    with pytest.raises(ValidationError, match="batch_size"):
        Record.model_validate({k: v for k, v in answer.items() if k != "batch_size"})
    assert sorted(ERRORS) == [400, 401, 413, 415, 422, 503, 504]
