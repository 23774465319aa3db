"""After a job failed as `storage`, probe storage again before the worker takes another job.

Why: storage that goes bad mid-run (a read-only remount, a bucket deleted, keys revoked) would
otherwise fail every job the worker takes, one after another, each for good. A permanent
storage failure puts storage in doubt: no new job is taken (a batch window closes admission and
drains), and before the next pop the worker runs the start-up probe again. If the probe passes
(a one-off fault, such as one object whose path was in the way) the worker carries on; if it
fails, the worker stops taking jobs and exits as it would have at start (workers/worker.py).
"""

from __future__ import annotations

from collections.abc import Callable

from shared.errors import StorageError
from shared.logs import get_logger
from shared.storage_probe import ProbeOutcome

log = get_logger(__name__)

STORAGE_KIND = "storage"  # workers/service/failures.py: storage refused a write for good


class StorageCheck:
    """In doubt from a job's storage failure until a probe settles it.

    `probe` is the start-up probe of the storage jobs write to (transient failures waited out
    up to COSYQ_STORAGE_PROBE_WAIT_S, as at start); `report` tells of a failed one as a failed
    start is told (log, pool, `cosyq status`) and returns the error the worker exits with.
    """

    def __init__(
        self,
        probe: Callable[[], ProbeOutcome],
        report: Callable[[ProbeOutcome], StorageError],
    ) -> None:
        self._probe = probe
        self._report = report
        self._doubted_by = ""  # the job whose failure put storage in doubt
        self.lost: StorageError | None = None  # from a failed probe: the worker must leave

    @property
    def in_doubt(self) -> bool:
        """True from a storage failure until a probe passed (or for good once one failed)."""
        return bool(self._doubted_by) or self.lost is not None

    def note_failure(self, job_id: str, kind: str) -> None:
        """A job's failure, as classified: only a `storage` one puts storage in doubt."""
        if kind == STORAGE_KIND and not self._doubted_by:
            self._doubted_by = job_id

    def recheck(self) -> StorageError | None:
        """Probe if in doubt; the error to exit with when storage is not usable, else None."""
        if self.lost is not None or not self._doubted_by:
            return self.lost
        outcome = self._probe()
        log.info(
            "storage_rechecked",
            after_job=self._doubted_by,
            url=outcome.url,
            ok=outcome.ok,
            cause=outcome.cause or None,
            probe_s=round(outcome.elapsed_s, 3),
        )
        self._doubted_by = ""
        if not outcome.ok:
            self.lost = self._report(outcome)
        return self.lost
