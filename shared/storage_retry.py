"""Retrying a storage write inside one job attempt, so synthesized audio is not thrown away.

A job whose write hits a passing fault (reset, timeout, HTTP 5xx, SlowDown, a full disk) would
otherwise fail its attempt and synthesize everything again on the retry. Here only the write is
repeated, with capped exponential backoff; a permanent error (StorageError) is raised at once.
The same backoff paces the worker's start-up probe (shared.storage_probe).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from shared.errors import StorageUnavailableError
from shared.logs import get_logger
from shared.storage import Storage, StoredObject

log = get_logger(__name__)


class BackoffSettings(Protocol):
    storage_retry_backoff_s: float
    storage_retry_backoff_max_s: float


@dataclass(frozen=True)
class Backoff:
    """Pause before retry k (1-based): first_s * 2**(k-1), at most max_s."""

    first_s: float
    max_s: float

    @classmethod
    def from_settings(cls, settings: BackoffSettings) -> Backoff:
        return cls(settings.storage_retry_backoff_s, settings.storage_retry_backoff_max_s)

    def delay_s(self, retry: int) -> float:
        return float(min(self.max_s, self.first_s * 2 ** max(0, retry - 1)))


def put_with_retries(
    storage: Storage,
    key: str,
    data: bytes,
    content_type: str,
    metadata: Mapping[str, str],
    *,
    attempts: int,
    backoff: Backoff,
    sleep: Callable[[float], None] = time.sleep,
) -> StoredObject:
    """`storage.put`, tried up to `attempts` times while it fails with StorageUnavailableError.

    The last transient error is raised as it is (the job's own retries take over from there).
    """
    for attempt in range(1, attempts + 1):
        try:
            return storage.put(key, data, content_type, metadata)
        except StorageUnavailableError as e:
            if attempt >= attempts:
                raise
            delay = backoff.delay_s(attempt)
            log.warning(
                "storage_write_retry",
                attempt=attempt,
                attempts=attempts,
                retry_in_s=delay,
                error=str(e),
            )
            sleep(delay)
    raise AssertionError("unreachable: attempts must be at least 1")
