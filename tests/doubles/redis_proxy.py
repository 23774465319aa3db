"""A TCP proxy in front of a real redis-server that can hold a transaction back, so a test
kills a process at the one moment between what it sent before its MULTI/EXEC and the EXEC.

`HoldingProxy(port)` forwards every connection to 127.0.0.1:`port` byte for byte. Once
`hold_next_exec(marker)` is called, the first piece a client sends that holds an EXEC (and
`marker`, e.g. b"rq:job:" for the transaction that enqueues jobs) is kept from
Redis (as is all that connection sends after it) and `held` is set: the process that sent it
waits for an answer that never comes, its transaction never applied. Whatever that connection
queued after its MULTI is dropped by Redis when the process dies and its connection closes.
`cut_next_exec(marker)` instead lets that piece through and cuts the connection when Redis
answers, its answer dropped: the transaction applied, the client told only that the connection
was lost (as when Redis restarts, or the network drops, between the two); with `refuse=n`, the
next `n` connections made after that are closed at once, unanswered (Redis away a moment: the
client's first reconnects fail), until `accept_again()`.
"""

from __future__ import annotations

import contextlib
import socket
import threading

EXEC = b"\r\nEXEC\r\n"  # RESP: *1\r\n$4\r\nEXEC\r\n


class HoldingProxy:
    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.held = threading.Event()
        self._armed = threading.Event()
        self._marker = b""
        self._cut = False
        self._cutting: set[socket.socket] = set()  # upstreams whose next answer ends them
        self._refusing = 0  # connections still to close unanswered once the cut is made
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def hold_next_exec(self, marker: bytes = b"") -> None:
        self._marker = marker
        self._armed.set()

    def cut_next_exec(self, marker: bytes = b"", *, refuse: int = 0) -> None:
        self._cut, self._refusing = True, refuse
        self.hold_next_exec(marker)

    def accept_again(self) -> None:
        """Redis back after `cut_next_exec(refuse=...)`: new connections are forwarded again."""
        self._refusing = 0

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing and self.held.is_set():
                self._refusing -= 1
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.redis_port))
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, from_client: bool) -> None:
        holding, tail, marked = False, b"", False
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if not from_client and source in self._cutting:
                    source.shutdown(socket.SHUT_RDWR)  # the answer to the EXEC: dropped,
                    break  # and both ends cut
                # a big transaction arrives in pieces: the marker and the EXEC in any of them
                seen = tail + data
                tail, marked = seen[-64:], marked or self._marker in seen
                if from_client and EXEC in seen:
                    if marked and self._holds():
                        holding = not self._cut
                        if self._cut:
                            self._cutting.add(target)
                        self.held.set()
                    tail, marked = b"", False  # the next transaction's own marker and EXEC
                if not holding:
                    target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_RDWR)  # wakes the other direction's recv too
        with contextlib.suppress(OSError):
            target.close()

    def _holds(self) -> bool:
        return self._armed.is_set() and not self.held.is_set()
