"""A dispatcher on a thread of its own, for processes that do other work (`cosyq serve`)."""

from __future__ import annotations

import threading

from producer.webhooks.dispatcher import WebhookDispatcher
from shared.connection import redis_connection
from shared.settings import Settings

STOP_WAIT_S = 30.0  # a stop lets in-flight tries end (each is bounded by its own timeout)


class BackgroundDispatcher:
    def __init__(self, settings: Settings) -> None:
        self.stop = threading.Event()
        dispatcher = WebhookDispatcher(redis_connection(settings), settings)
        self.thread = threading.Thread(
            target=dispatcher.run, args=(self.stop,), name="cosyq-webhooks", daemon=True
        )

    def start(self) -> BackgroundDispatcher:
        self.thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=STOP_WAIT_S)
