"""Whether a host answers, decided within seconds: offline, the hub and storage clients would retry for minutes."""

from __future__ import annotations

import socket
import threading


def unreachable(host: str, port: int, timeout: float) -> str | None:
    """Why ``host:port`` cannot be reached (name lookup or TCP connect), in words, or None; at most ``timeout``
    seconds, name lookup included (run in a thread, since getaddrinfo has no timeout of its own)."""
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(f"{host}:{port} does not answer ({type(e).__name__}: {e})")

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"{host}:{port} did not answer within {timeout:g} s"
