"""Finish what a crash left between a document's last segment and its assembly job.

`record_segment` sets the assembly marker and notes the document pending in one Lua script;
the worker then enqueues the job the marker names and clears the note. A worker killed between
the two leaves a marker naming a job that does not exist: re-running the segment cannot help
(the marker's SET NX fails), so every worker's housekeeping runs this sweep (one holder per
tick, under a short lock): a note COSYQ_DOCUMENT_ASSEMBLY_GRACE_S old whose marker names no job
gets that job enqueued, with the marker's own id (so a live worker that enqueues it in the
same moment makes the same job, once). A note whose document is assembled, expired, or whose
marker a retry cleared is dropped.
"""

from __future__ import annotations

from rq.job import Job

from shared.document_state import (
    ASSEMBLY_SWEEP_LOCK,
    DocumentNotFoundError,
    assembly_enqueued,
    assembly_job_id,
    enqueue_assembly,
    load_plan,
    load_result,
    pending_assemblies,
)
from shared.logs import get_logger
from workers.documents.duty import LockedDuty

log = get_logger(__name__)
SWEEP_BATCH = 20  # documents looked at per tick (a crash leaves one; the rest wait a tick)


class AssemblySweep(LockedDuty):
    """A housekeeping duty: `tick()` once per heartbeat interval, one holder per tick."""

    lock_key = ASSEMBLY_SWEEP_LOCK

    def tick(self) -> list[str]:
        """The documents whose assembly job this tick enqueued."""
        if not self.holds_this_tick():
            return []
        grace = self.settings.document_assembly_grace_s
        enqueued = []
        for document_id in pending_assemblies(self.connection, grace, SWEEP_BATCH):
            if self._finish(document_id):
                enqueued.append(document_id)
            assembly_enqueued(self.connection, document_id)
        return enqueued

    def _finish(self, document_id: str) -> bool:
        job_id = assembly_job_id(self.connection, document_id)
        if job_id is None or Job.exists(job_id, connection=self.connection):
            return False
        if load_result(self.connection, document_id) is not None:
            return False
        try:
            plan = load_plan(self.connection, document_id)
        except DocumentNotFoundError:
            return False
        enqueue_assembly(
            self.connection,
            self.settings,
            document_id,
            job_id,
            plan.priority,
            tenant=plan.tenant,
        )
        log.warning("document_assembly_recovered", document_id=document_id, job_id=job_id)
        return True
