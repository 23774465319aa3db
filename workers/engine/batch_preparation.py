"""The batch session's preparation thread (`cosyq-model-prepare`): each submitted request's
front end (number spelling, splitting, tokens: up to a second or more for a long text), one at
a time in the order they came, beside the model thread, which keeps stepping its rows meanwhile.

What was submitted together is handed over together (admitted at one step boundary, as when the
model thread made them: rows that start together finish together and share their flow calls).
The thread also runs the callables put in its queue in order (an alone rerun's front end, the
session's close marker). Once `halt`ed (the model thread crashed) it runs no more front ends:
each job is handed over as it is, for the session to settle with the crash's error.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable

from workers.engine.api import SynthesisInput
from workers.engine.batch_jobs import Job
from workers.engine.requests import RequestPlan

Item = Job | Callable[[], None] | None  # None: the thread ends


class Preparation:
    """The front ends of a session's jobs, on a thread of their own; each group of jobs
    prepared together goes to `hand_over`."""

    def __init__(
        self,
        begin: Callable[[SynthesisInput], RequestPlan],
        hand_over: Callable[[list[Job]], None],
    ) -> None:
        self._begin = begin
        self._hand_over = hand_over
        self._items: queue.Queue[Item] = queue.Queue()
        self._halted = False
        self._thread = threading.Thread(target=self._loop, name="cosyq-model-prepare", daemon=True)
        self._thread.start()

    def put(self, item: Job | Callable[[], None]) -> None:
        self._items.put(item)

    def halt(self) -> None:
        """Run no more front ends (the jobs still come to `hand_over`, unprepared)."""
        self._halted = True

    def stop(self) -> None:
        """End the thread once everything put before has been handed over or run."""
        self._items.put(None)
        self._thread.join()

    def _loop(self) -> None:
        while True:
            items = [self._items.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    items.append(self._items.get_nowait())
            group: list[Job] = []
            for item in items:
                if isinstance(item, Job):
                    self._prepare(item)
                    group.append(item)
                    continue
                if group:
                    self._hand_over(group)
                    group = []
                if item is None:
                    return
                item()  # an alone rerun's front end, or the close marker
            if group:
                self._hand_over(group)

    def _prepare(self, job: Job) -> None:
        """The job's front end; its error, if any, is settled on the model thread."""
        if not job.future.cancelled() and not self._halted:
            try:
                job.plan = self._begin(job.request)
            except BaseException as e:  # the request's own: its future's exception
                job.error = e
