"""A housekeeping duty every worker runs and one holds per tick (`LockedDuty`): the assembly
sweep, the document keepalive, the webhook bodies' keeper (workers/service/webhook_bodies.py)
and, deleting through the worker's storage (`StorageDuty`), the segment audio cleanups. Each
tick first takes the duty's short Redis lock (one heartbeat interval); a worker that does not
get it does nothing this tick."""

from __future__ import annotations

import redis

from shared.settings import Settings
from shared.storage import Storage


class LockedDuty:
    """Called once per heartbeat interval by the housekeeper; `tick()` is the duty's work."""

    lock_key = ""  # the duty's lock (`shared.document_state`)

    def __init__(self, connection: redis.Redis, settings: Settings, *, holder: str) -> None:
        self.connection = connection
        self.settings = settings
        self.holder = holder

    def __call__(self) -> None:
        self.tick()

    def tick(self) -> list[str]:
        raise NotImplementedError

    def holds_this_tick(self) -> bool:
        """Whether this worker took the duty's lock for this tick."""
        lock_ms = max(1, int(self.settings.heartbeat_interval_s * 1000))
        return bool(self.connection.set(self.lock_key, self.holder, nx=True, px=lock_ms))


class StorageDuty(LockedDuty):
    """A duty that deletes through `storage` (the worker's own)."""

    def __init__(
        self, connection: redis.Redis, settings: Settings, *, holder: str, storage: Storage
    ) -> None:
        super().__init__(connection, settings, holder=holder)
        self.storage = storage
