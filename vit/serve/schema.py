"""The shapes of `vit serve`'s answers and requests, as its OpenAPI schema (GET /openapi.json) states them.

The handlers read the request themselves (three formats, counted as it arrives) and answer with a JSONResponse,
so these models validate nothing at run time: they tell a generated client, and a person, what comes back.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Entry(BaseModel):
    """One class of a `vit predict` record's top-k."""

    model_config = ConfigDict(populate_by_name=True)

    index: int = Field(alias="class", description="the class index")
    name: str = Field(description="the class name, as `vit predict` writes it")
    probability: float = Field(description="softmax probability, rounded to 6 digits")


class Record(BaseModel):
    """POST /predict's answer: `vit predict`'s record for the upload, with the batch and timings."""

    path: str = Field(description="the multipart file name, or 'upload'")
    top_k: list[Entry] = Field(description="most likely first")
    error: str | None = Field(description="null when the image was read; `vit predict` writes its errors here")
    batch_size: int = Field(description="how many requests shared this one's batch")
    timing_ms: dict[str, float] = Field(description="decode, queue, inference and total, in milliseconds")
    attention_png: str | None = Field(None, description="base64 PNG of the attention rollout (only with ?attention=1)")
    # a calibrated model's (`vit calibrate`, docs/confidence.md)
    answer: str | None = Field(None, description="the decision: top_k's first class, or the unknown label when the "
                               "score is over the threshold (top_k stays the model's classes either way)")
    # a model with an unknown score (`vit fit --calibrate unknown`, `vit calibrate`; docs/confidence.md)
    unknown: bool | None = Field(None, description="whether the image was answered with the unknown label")
    score: float | None = Field(None, description="the unknown score (higher: less like the training images); "
                                "answered unknown above the threshold GET /info's calibration states")
    # a multi-label model's (docs/multilabel.md); its top_k are then sigmoid probabilities
    labels: list[Entry] | None = Field(None, description="every class at or over its threshold (chosen on val), "
                                       "most likely first")


class Label(BaseModel):
    """One element of POST /'s answer: the Hugging Face image-classification task's output element."""

    label: str = Field(description="the class name (`vit predict`'s name): always the model's top classes; the "
                       "decision (a class, or the unknown label) is in the X-Answer header")
    score: float = Field(description="calibrated softmax probability (`vit predict`'s probability)")


class Error(BaseModel):
    """Every error answer."""

    detail: str = Field(description="what went wrong and what to do, for a person")
    code: str = Field(description="short and stable, for a program: bad_image, too_large, bad_top_k, ...")


# The Hugging Face task's JSON body (both routes read top_k; POST / also reads function_to_apply)
TASK_REQUEST = {
    "type": "object", "required": ["inputs"],
    "properties": {
        "inputs": {"type": "string", "description": "the image bytes as base64 (or a data:image/...;base64, URL)"},
        "parameters": {"type": "object", "properties": {
            "top_k": {"type": "integer", "minimum": 1, "description": "how many classes, most likely first"},
            "function_to_apply": {"type": "string", "enum": ["softmax"], "description": "softmax is the one served"},
        }},
    },
}


def request_body(*, untyped: bool) -> dict:
    """The OpenAPI ``requestBody`` of a route that reads an image in the three formats (``untyped``: a body with
    no Content-Type, or application/octet-stream, is read as the image too, as huggingface_hub sends bytes)."""
    binary = {"schema": {"type": "string", "format": "binary"}}
    content = {
        "image/*": binary,
        "application/json": {"schema": TASK_REQUEST},
        "multipart/form-data": {"schema": {"type": "object", "required": ["file"],
                                           "properties": {"file": {"type": "string", "format": "binary"}}}},
    }
    if untyped:
        content["application/octet-stream"] = binary
    return {"requestBody": {"required": True, "content": content}}


ERRORS = {status: {"model": Error, "description": words} for status, words in {
    400: "bad data: empty, unreadable image, invalid JSON or base64", 401: "no or wrong X-API-Key",
    413: "the body is over --max_body_mb", 415: "not an accepted Content-Type or image format",
    422: "a bad parameter, or too many pixels", 503: "busy or still loading (with Retry-After)",
    504: "no answer within --timeout_s"}.items()}
