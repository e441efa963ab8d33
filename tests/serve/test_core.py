"""What `vit serve` does below HTTP (`vit.serve.core`): an upload checked from its header, a HEIC photo told its way
or read."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from tests.serve.test_app import HEIC, TEXT


def test_a_heic_upload_is_told_to_come_as_jpeg(without_pillow_heif):
    """An iPhone's HEIC photo was "not a JPEG, PNG, ... image", as a text file is."""
    from vit.serve.core import RequestError, check_upload

    with pytest.raises(RequestError, match=r"not a JPEG, .* or PNM image: it is a HEIC photo \(an iPhone's\), which "
                       r"this server reads only with pillow-heif installed; send it as JPEG"):
        check_upload(HEIC, 10**6)
    with pytest.raises(RequestError) as text:
        check_upload(TEXT, 10**6)
    assert "HEIC" not in str(text.value)


def test_with_pillow_heif_a_heic_upload_is_read():
    """The test environment has the optional pillow-heif (the dev extra): an iPhone's photo is then an image."""
    from vit.serve.core import RequestError, check_upload, decode

    photo = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    photo.save(buffer, "HEIF", quality=95)
    assert check_upload(buffer.getvalue(), 10**6) == (60, 40)
    decoded = decode(buffer.getvalue(), "RGB")
    assert decoded.size == (60, 40) and decoded.mode == "RGB"
    with pytest.raises(RequestError, match=r"not a JPEG, .* PNM or HEIC image$"):
        check_upload(HEIC, 10**6)  # a HEIC header over zeros: no longer told to come as JPEG
