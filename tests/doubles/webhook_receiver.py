"""A real HTTP receiver for webhook tests: a stdlib server on 127.0.0.1 that records every POST
(headers and body) and answers with the statuses a test scripts (then 200)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: str


@dataclass
class Receiver:
    url: str
    calls: list[Received] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)  # next statuses to send, then 200
    delay_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_status(self) -> int:
        with self.lock:
            return self.answers.pop(0) if self.answers else 200


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            body = self.rfile.read(length).decode("utf-8")
            stopped = threading.Event()
            stopped.wait(receiver.delay_s)
            with receiver.lock:
                receiver.calls.append(Received(self.path, dict(self.headers), body))
            status = receiver.next_status()
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", receiver.url + "redirected")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(f"http://127.0.0.1:{server.server_address[1]}/hooks/")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
