"""A dispatcher on a thread of its own, for processes that do other work (`cosyq serve`)."""

from __future__ import annotations

import threading

from producer.webhooks.dispatcher import WebhookDispatcher
from shared.connection import redis_connection
from shared.errors import SettingsError
from shared.logs import get_logger
from shared.settings import Settings

log = get_logger(__name__)

STOP_WAIT_S = 30.0  # a stop lets in-flight tries end (each is bounded by its own timeout)


class BackgroundDispatcher:
    def __init__(self, settings: Settings) -> None:
        self.stop = threading.Event()
        dispatcher = WebhookDispatcher(redis_connection(settings), settings)
        self.thread = threading.Thread(
            target=_run, args=(dispatcher, self.stop), name="cosyq-webhooks", daemon=True
        )

    def start(self) -> BackgroundDispatcher:
        self.thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=STOP_WAIT_S)


def _run(dispatcher: WebhookDispatcher, stop: threading.Event) -> None:
    """The dispatcher until `stop`; Redis refusing the settings ends it with one error line
    (the HTTP front goes on answering)."""
    try:
        dispatcher.run(stop)
    except SettingsError as e:
        log.error("webhook_dispatcher_refused", error=str(e))
