"""The page at / in a real browser: Playwright for Python driving the system's Chromium (`apt-get install
chromium`; `playwright install` would download one, which this machine cannot). Uploads through the file
input and through a drop, compares the top-k rows with the API's answer for the same file, decodes the
attention overlay, shows a text file's error, and records every request the page makes: none may leave
the loopback address."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.serve.conftest import make_app

CHROMIUM = os.environ.get("VIT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
LOOPBACK = {"127.0.0.1", "localhost", "[::1]", "::1"}


@pytest.fixture
def live_url(predictor) -> Iterator[str]:
    """The app on a real uvicorn socket (127.0.0.1, a free port), run in a thread of this process."""
    import uvicorn

    from vit.commands.serve import bind

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(make_app(predictor), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for _ in range(200):
        if server.started:
            break
        threading.Event().wait(0.05)
    yield url
    server.should_exit = True
    thread.join(10)


def test_the_page_in_chromium(live_url, digit_pngs, tmp_path):
    import playwright.sync_api as playwright_api  # the dev extra brings it

    if not Path(CHROMIUM).is_file():
        why = f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set VIT_CHROMIUM)"
        if os.environ.get("CI"):  # .ci/run installs it: there a missing browser is a failure, not a skip
            pytest.fail(why)
        pytest.skip(why)
    first, second = digit_pngs[0][0], digit_pngs[0][1]
    api = {p: httpx.post(f"{live_url}/predict", files={"file": (p.name, p.read_bytes())}).json()["top_k"]
           for p in (first, second)}
    text_file = tmp_path / "notes.jpg"
    text_file.write_text("not an image\n")
    requested: list[str] = []

    def rows(page) -> list[tuple[int, str, float]]:
        page.wait_for_selector("[data-testid=topk-row]")
        return [(int(r.get_attribute("data-class")), r.query_selector("[data-testid=topk-name]").inner_text(),
                 float(r.get_attribute("data-probability"))) for r in page.query_selector_all("[data-testid=topk-row]")]

    def expected(path: Path) -> list[tuple[int, str, float]]:
        return [(e["class"], e["name"], e["probability"]) for e in api[path]]

    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 900, "height": 640})
        page.on("request", lambda request: requested.append(request.url))
        page.goto(live_url)
        page.wait_for_function("document.getElementById('model-info').textContent.includes('classes')")
        assert page.is_visible("[data-testid=attention-toggle]")  # /info says a checkpoint: attention available

        # 1. through the file input
        page.set_input_files("[data-testid=file-input]", str(first))
        page.wait_for_function("document.getElementById('status').textContent.includes('ms')")
        assert rows(page) == expected(first)
        assert page.is_visible("[data-testid=preview]")

        # 2. through a drop of a file onto the zone
        data = base64.b64encode(second.read_bytes()).decode()
        transfer = page.evaluate_handle(
            """([name, data]) => { const bytes = Uint8Array.from(atob(data), c => c.charCodeAt(0));
                 const dt = new DataTransfer(); dt.items.add(new File([bytes], name, {type: 'image/png'}));
                 return dt; }""", [second.name, data])
        page.evaluate("document.getElementById('topk').replaceChildren()")
        page.dispatch_event("[data-testid=dropzone]", "drop", {"dataTransfer": transfer})
        assert rows(page) == expected(second)

        # 3. the attention overlay: toggling resends the last file; the PNG must decode
        page.check("[data-testid=attention-toggle]")
        page.wait_for_function("document.getElementById('overlay').complete && "
                               "document.getElementById('overlay').naturalWidth > 0 && "
                               "!document.getElementById('overlay-fig').hidden")
        size = page.evaluate("[document.getElementById('overlay').naturalWidth, "
                             "document.getElementById('overlay').naturalHeight]")
        assert min(size) >= 224
        assert rows(page) == expected(second)
        page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
        if os.environ.get("VIT_SERVE_SCREENSHOT"):  # a copy to look at, outside pytest's folders
            page.screenshot(path=os.environ["VIT_SERVE_SCREENSHOT"], full_page=True)

        # 4. a text file named .jpg: the server's words on the page
        page.set_input_files("[data-testid=file-input]", str(text_file))
        page.wait_for_selector("[data-testid=error]:visible")
        error = page.inner_text("[data-testid=error]")
        assert "not a JPEG, PNG" in error and "415" in error
        assert page.query_selector_all("[data-testid=topk-row]") == []
        browser.close()

    hosts = {urlsplit(url).hostname for url in requested if urlsplit(url).scheme in ("http", "https", "ws", "wss")}
    assert requested and hosts <= LOOPBACK, f"the page reached beyond this machine: {sorted(hosts - LOOPBACK)}"
    assert all(urlsplit(u).scheme in ("http", "blob", "data") for u in requested), requested


def test_a_multi_label_answer_shows_its_labels_as_chips(quadrant_run, tmp_path):
    """The page of a multi-label model: one chip per label of the API's answer, with its probability; a
    single-label answer (the test above) has no chips."""
    import playwright.sync_api as playwright_api
    import uvicorn

    from vit.commands.serve import bind
    from vit.deploy import load_classifier
    from vit.serve.core import Predictor

    if not Path(CHROMIUM).is_file():
        why = f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set VIT_CHROMIUM)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(make_app(Predictor(load_classifier(quadrant_run / "model.ckpt"))),
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    while not server.started:
        threading.Event().wait(0.05)
    try:
        images = sorted((quadrant_run / "images").glob("*.png"))
        answers = {p: httpx.post(f"{url}/predict", files={"file": (p.name, p.read_bytes())}).json()["labels"]
                   for p in images[:10]}
        several = next(p for p, labels in answers.items() if len(labels) > 1)
        with playwright_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 900, "height": 640})
            page.goto(url)
            page.wait_for_function("document.getElementById('model-info').textContent.includes('classes')")
            page.set_input_files("[data-testid=file-input]", str(several))
            page.wait_for_selector("[data-testid=label-chip]")
            chips = [c.inner_text() for c in page.query_selector_all("[data-testid=label-chip]")]
            assert chips == [f"{e['name']}{e['probability'] * 100:.1f}%" for e in answers[several]]
            page.screenshot(path=str(tmp_path / "chips.png"), full_page=True)
            if os.environ.get("VIT_SERVE_SCREENSHOT"):
                page.screenshot(path=os.environ["VIT_SERVE_SCREENSHOT"], full_page=True)
            browser.close()
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_unknown_note_stays_inside_its_card(tmp_path):
    """The "unknown" note was one row of the classes' two-column grid: its text went into the 64-px probability
    column and ran out of the card. Drawn here from the page's own script, with a long nearest class name."""
    import playwright.sync_api as playwright_api

    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    from importlib.resources import files

    html = files("vit.serve").joinpath("page.html").read_text()
    answer = {"unknown": True, "answer": "unknown", "score": 12.3456, "nearest": "a_rather_long_class_name_" * 2,
              "top_k": [{"class": 0, "name": "cat", "probability": 0.9}], "timing_ms": {"total": 5.0}, "batch_size": 1}
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 900, "height": 640})
        page.route("**/*", lambda route: route.abort())  # no server: the page's own requests fail, quietly
        page.set_content(html)
        page.evaluate("answer => showResult(answer)", answer)
        note = page.query_selector("[data-testid=unknown]").bounding_box()
        card = page.evaluate("(() => { const r = document.getElementById('topk').closest('.card')"
                             ".getBoundingClientRect(); return {x: r.x, width: r.width}; })()")
        words = page.evaluate("(() => { const range = document.createRange(); "
                              "range.selectNodeContents(document.querySelector('[data-testid=unknown]')); "
                              "const r = range.getBoundingClientRect(); return {x: r.x, right: r.right}; })()")
        browser.close()
    assert note["x"] >= card["x"] and note["x"] + note["width"] <= card["x"] + card["width"]
    assert words["right"] <= card["x"] + card["width"]  # the text itself, not only its box
