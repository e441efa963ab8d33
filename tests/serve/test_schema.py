"""FastAPI's OpenAPI schema of `vit serve` (`vit.serve.schema`) states both answers: the record of /predict and
the Hugging Face task's list of POST / (what a generated client is built from)."""

from __future__ import annotations

import asyncio

from tests.serve.conftest import client_of, make_app


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
