"""`vit serve` as a command: its defaults, its start-up errors, and one real-socket run that ends with
SIGTERM while 16 requests are in flight (all 16 answered, new connections refused, exit 0)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

import httpx
import pytest

from tests.serve.conftest import huge_png, serving
from vit.commands import main
from vit.commands.serve import bind, parse_args
from vit.deploy import load_classifier
from vit.deploy.predict import predict_files


def test_defaults_are_the_documented_ones():
    args = parse_args(["--ckpt", "m.ckpt"])
    assert (args.host, args.port, args.max_batch_size, args.batch_timeout_ms) == ("127.0.0.1", 8000, 8, 10.0)
    assert (args.max_queue, args.timeout_s, args.max_body_mb, args.max_pixels) == (64, 30.0, 10.0, 40e6)
    assert args.cors_origin is None and args.api_key_env is None and args.top_k == 5
    assert args.threads == max(1, len(os.sched_getaffinity(0)) // 2)  # half the cores: the rest parse and decode


def test_connections_on_the_bound_socket_send_without_nagle_delay():
    """asyncio sets TCP_NODELAY only on sockets that say IPPROTO_TCP; without it each answer waited ~40 ms."""
    async def go():
        accepted = asyncio.get_running_loop().create_future()
        server = await asyncio.start_server(lambda r, w: accepted.set_result(w), sock=bind("127.0.0.1", 0))
        async with server:
            _, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            connection = (await accepted).get_extra_info("socket")
            nodelay = connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            writer.close()
            (await accepted).close()
            return nodelay

    assert asyncio.run(go()) != 0


@pytest.mark.parametrize("argv, words", [
    (["--ckpt", "missing.ckpt"], "missing.ckpt"),
    (["--ckpt", "m.ckpt", "--api_key_env", "VIT_TEST_NO_SUCH_KEY"], "VIT_TEST_NO_SUCH_KEY"),
])
def test_start_up_mistakes_are_one_short_message(argv, words, capsys, monkeypatch):
    monkeypatch.delenv("VIT_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and words in err and "Traceback" not in err and len(err.splitlines()) <= 3


def test_a_taken_port_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ValueError, match=r"cannot listen on 127\.0\.0\.1:\d+ .*--port 0"):
            bind("127.0.0.1", taken.getsockname()[1])


def test_over_a_socket_then_sigterm_with_16_in_flight(fitted, digit_pngs):
    """16 uploads send half their body, SIGTERM comes, then they send the rest: all 16 are answered."""
    checkpoint = next((fitted / "ckpt").glob("best-*.ckpt"))
    path = digit_pngs[0][0]
    expected = predict_files(load_classifier(checkpoint), [path])[0]
    with serving(checkpoint, "--max_pixels", "300000000") as (url, server):  # over PIL's guard (2 x 89,478,485)
        sent = path.read_bytes()

        async def go():
            go_on = asyncio.Event()

            async def body():  # half the image, then a pause until SIGTERM has been sent
                yield sent[: len(sent) // 2]
                await go_on.wait()
                yield sent[len(sent) // 2:]

            async with httpx.AsyncClient(base_url=url, timeout=30) as client, \
                    httpx.AsyncClient(base_url=url, timeout=5) as probe:
                page = await probe.get("/")
                assert page.status_code == 200 and "data-testid" in page.text
                one = await probe.post("/predict", files={"file": (path.name, sent)})
                assert one.json()["top_k"] == expected["top_k"]  # over HTTP, as `vit predict` wrote it
                assert "access-control-allow-origin" not in one.headers
                # --max_pixels above PIL's guard is the limit: 195 MP passes the header check (its junk pixels
                # then fail to decode), 400 MP is over it and said to be
                real = huge_png(15000, 13000)
                junk = real[:33] + b"\0\0\0\x04IDAT" + b"junk" + real[-12:]  # its IHDR, 4 bad IDAT bytes, IEND
                passed = await probe.post("/predict", content=junk, headers={"Content-Type": "image/png"})
                assert passed.json()["code"] == "bad_image", passed.text
                over = await probe.post("/predict", content=huge_png(), headers={"Content-Type": "image/png"})
                assert "300,000,000 (--max_pixels)" in over.json()["detail"], over.text
                tasks = [asyncio.create_task(client.post("/predict", content=body(),
                                                         headers={"Content-Type": "image/png"}))
                         for _ in range(16)]
                for _ in range(200):  # until the server has all 16 (and this probe) in flight
                    if "vit_in_flight 17.0" in (await probe.get("/metrics")).text:
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError("the 16 requests never were all in flight")
                server.send_signal(signal.SIGTERM)
                signalled = time.perf_counter()
                await asyncio.sleep(0.5)
                with pytest.raises(httpx.ConnectError):  # the listener is closed: no new connections
                    async with httpx.AsyncClient(base_url=url, timeout=2) as late:
                        await late.get("/livez")
                go_on.set()
                return signalled, await asyncio.gather(*tasks)

        signalled, responses = asyncio.run(go())
        assert [r.status_code for r in responses] == [200] * 16
        assert all(r.json()["top_k"] == expected["top_k"] for r in responses)
        code = server.wait(timeout=10)
        assert code == 0 and time.perf_counter() - signalled < 10
