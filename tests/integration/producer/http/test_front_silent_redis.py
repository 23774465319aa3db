"""`cosyq serve` started while Redis was away (its port refused), then a service that takes
each connection and closes it unanswered on that port (the URL named the wrong one): the
running front exits on nothing (it has served; a Redis restarting behind a proxy looks the
same), but its /readyz no longer calls it an outage alone: it says the close may mean no
Redis. It said "Connection closed by server." and nothing more, for ever."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

from tests.integration.producer.http.conftest import start_front


def test_readyz_names_a_silent_server_that_came_after_the_start(tmp_path: Path) -> None:
    reserved = socket.socket()
    reserved.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    port = reserved.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/0"
    front = start_front(tmp_path / "front", url, COSYQ_REDIS_SILENT_CLOSE_S="0.5")
    try:
        with front.http(key=None) as http:  # a front without keys: /readyz shows why
            refused = http.get("/readyz")
            assert refused.status_code == 503
            assert "no Redis has answered" not in refused.json()["error"]["message"]
            reserved.listen()

            def close_each() -> None:
                with contextlib.suppress(OSError):
                    while True:
                        reserved.accept()[0].close()

            threading.Thread(target=close_each, daemon=True).start()
            closed = http.get("/readyz")
        assert closed.status_code == 503
        error = closed.json()["error"]
        assert error["code"] == "redis_unreachable"
        assert (
            "closed without a reply, and no Redis has answered this process yet"
            in (error["message"])
        )
        assert "use rediss://" in error["message"]
        assert front.process.poll() is None  # running: it waits for Redis, as before
    finally:
        reserved.close()
        front.stop()
