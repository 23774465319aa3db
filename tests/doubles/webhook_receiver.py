"""A real HTTP receiver for webhook tests: a stdlib server on 127.0.0.1 that records every POST
(headers and body) and answers with the statuses a test scripts (then 200), a failed answer
quoting the path posted to with `echo_path`; or, with
`trickle_s`, a slow one that answers one byte every `trickle_s` seconds for as long as the
caller listens, counting the POSTs it holds at once (in all, and per webhook-id)."""

from __future__ import annotations

import itertools
import select
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO


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
    echo_path: bool = False  # a failed answer's body quotes the path it was posted to
    error_body: bytes = b""  # a failed answer's body (unless echo_path)
    trickle_s: float = 0.0  # > 0: answer one byte per this many seconds, never finishing
    on_post: Callable[[], None] | None = None  # run once a POST is read, before it is recorded
    holding: dict[str, int] = field(default_factory=dict)  # webhook-id -> POSTs held now
    most_held: int = 0  # the most POSTs held at once
    most_held_one_id: int = 0  # the most POSTs of one webhook-id held at once
    cut_off: int = 0  # trickled answers the caller hung up on
    closing: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_status(self) -> int:
        with self.lock:
            return self.answers.pop(0) if self.answers else 200

    def trickle(self, webhook_id: str, out: BinaryIO, sock: socket.socket) -> None:
        """One byte of a never-ending answer every `trickle_s` until the caller hangs up
        (seen at once: the socket turns readable at its end)."""
        with self.lock:
            self.holding[webhook_id] = self.holding.get(webhook_id, 0) + 1
            self.most_held = max(self.most_held, sum(self.holding.values()))
            self.most_held_one_id = max(self.most_held_one_id, self.holding[webhook_id])
        try:
            for byte in itertools.cycle(b"HTTP/1.1 200 OK\r\nx-slow: "):
                out.write(bytes([byte]))
                out.flush()
                readable, _, _ = select.select([sock], [], [], self.trickle_s)
                if self.closing.is_set():
                    return
                if readable and not sock.recv(1, socket.MSG_PEEK):
                    raise ConnectionResetError("the caller hung up")
        except OSError:
            with self.lock:
                self.cut_off += 1
        finally:
            with self.lock:
                self.holding[webhook_id] -= 1


@contextmanager
def webhook_receiver(tls: tuple[Path, Path] | None = None) -> Iterator[Receiver]:
    """A receiver on 127.0.0.1; with `tls` (certificate and key PEM files), an https one."""
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            body = self.rfile.read(length).decode("utf-8")
            stopped = threading.Event()
            stopped.wait(receiver.delay_s)
            if receiver.on_post is not None:
                receiver.on_post()
            with receiver.lock:
                receiver.calls.append(Received(self.path, dict(self.headers), body))
            if receiver.trickle_s > 0:
                self.close_connection = True
                receiver.trickle(self.headers.get("webhook-id", ""), self.wfile, self.connection)
                return
            status = receiver.next_status()
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", receiver.url + "redirected")
            said = (
                f"no route for POST {self.path}".encode()
                if receiver.echo_path
                else receiver.error_body
            )
            self.send_header("content-length", str(len(said) if status >= 300 else 0))
            self.end_headers()
            if status >= 300:
                self.wfile.write(said)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    receiver = Receiver(f"{scheme}://127.0.0.1:{server.server_address[1]}/hooks/")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.closing.set()
        server.shutdown()
        server.server_close()
