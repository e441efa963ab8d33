"""`vit.network.unreachable`: a port that answers is reachable, one that refuses is named, within the timeout."""

from __future__ import annotations

import socket
import time

from vit.network import unreachable


def test_a_listening_port_is_reachable_and_a_closed_one_is_named():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert unreachable("127.0.0.1", port, timeout=5.0) is None
    # the socket is closed now: nothing listens on the port, the connect is refused at once
    start = time.monotonic()
    why = unreachable("127.0.0.1", port, timeout=5.0)
    assert why.startswith(f"127.0.0.1:{port} does not answer (ConnectionRefusedError") and time.monotonic() - start < 5


def test_a_lookup_that_outlasts_the_timeout_is_cut_off(monkeypatch):
    def hangs(*args, **kwargs):
        time.sleep(2)
        raise OSError("too late")

    monkeypatch.setattr(socket, "create_connection", hangs)
    start = time.monotonic()
    assert unreachable("example.invalid", 443, timeout=0.2) == "example.invalid:443 did not answer within 0.2 s"
    assert time.monotonic() - start < 1.5
