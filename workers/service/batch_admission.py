"""Which jobs may join a worker's batch, and taking them off the queues without losing one.

RQ has no batch dequeue (rq#928) and its multi-queue pop is BLPOP: a popped job lives only in
the worker's memory until it is registered as started. The batch runner therefore pops with
one Lua script that takes up to `n` ids from the queues in priority order (high, default, low),
each priority's tenant queues round-robin (fair share, shared/tenants.py), non-blocking, inside
a `ColdStopGuard`: a cold stop (second signal) that lands between the pop
and the moment the ids are held in `PoppedJobs` waits for the guarded section to end, and
whatever a stopping worker holds but has not started goes back to the head of its queue
(`push_back_popped`). A Redis error while reading a popped job's hash is an outage, not a
verdict: that id and the ones after it go back (waiting for Redis); only a hash that was read
and does not load is refused. (Blocking the signals instead would not do: the kernel hands a
signal blocked in one thread to another, and Python runs the handler in the main thread at
once anyway.)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer
from rq.utils import as_text

from shared import keys, tenants
from shared.logs import get_logger
from workers.service.admission import CosyqJob
from workers.service.outage import refuse_or_wait, until_reachable

log = get_logger(__name__)

# Pop up to ARGV[1] ids from KEYS; ARGV[2..] are the sizes of KEYS's priority groups, in
# priority order. Within a group the keys are taken round-robin (one id from each non-empty key
# in turn: fair share between tenants); a group is drained before the next is looked at.
# Returns a flat list key, id, key, id, ...
_POP_MANY = """
local out = {}
local want = 2 * tonumber(ARGV[1])
local first = 1
for g = 2, #ARGV do
  local live = {}
  for k = first, first + tonumber(ARGV[g]) - 1 do live[#live + 1] = KEYS[k] end
  first = first + tonumber(ARGV[g])
  while #live > 0 and #out < want do
    local still = {}
    for _, key in ipairs(live) do
      if #out >= want then break end
      local id = redis.call('LPOP', key)
      if id then
        out[#out + 1] = key
        out[#out + 1] = id
        still[#still + 1] = key
      end
    end
    live = still
  end
  if #out >= want then break end
end
return out
"""


def batchable(job: Job) -> bool:
    """Only synthesize jobs share the model as rows; anything else (add_voice) runs alone, and
    so does a streamed synthesis (`stream: true`): its chunks go out as they are made."""
    return job.func_name == keys.SYNTHESIZE_FUNCTION and not streamed(job)


def streamed(job: Job) -> bool:
    """A streamed synthesis: popped during a window, it runs on the model thread ahead of the
    rows (`BatchSession.run_first`), so it never waits for the window to drain. Anything else
    that cannot join goes back to the head of its queue and is taken next, alone."""
    if job.func_name != keys.SYNTHESIZE_FUNCTION:
        return False
    request = job.kwargs.get("request") if isinstance(job.kwargs, dict) else None
    return isinstance(request, dict) and request.get("stream") is True


def synthesis_payload(job: Job) -> Any:
    """The `request` argument of a synthesize job (admission has checked that it binds)."""
    from workers import tasks  # noqa: PLC0415 - the job module imports the engine API

    bound = inspect.signature(tasks.synthesize).bind(*job.args, **job.kwargs)
    return bound.arguments["request"]


class ColdStopGuard:
    """While a section is held, a cold stop is only noted; it runs when the section ends.

    Signal handlers run in the main thread between two bytecodes, so a held section in that
    thread sees either no cold stop or one that has fully waited for it.
    """

    def __init__(self) -> None:
        self._depth = 0
        self._pending: Callable[[], None] | None = None

    @contextmanager
    def held(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and self._pending is not None:
                action, self._pending = self._pending, None
                action()

    def defer(self, action: Callable[[], None]) -> bool:
        """Keep `action` for the end of the held section; False when none is held."""
        if self._depth == 0:
            return False
        self._pending = action
        return True


@dataclass
class Unreadable:
    """A popped id whose hash would not decode: the worker refuses it (never runs it)."""

    error: Exception
    job_id: str
    queue: Queue


@dataclass
class PoppedJobs:
    """Jobs taken off the queues and not yet started or given back."""

    held: list[tuple[Job, Queue]] = field(default_factory=list)

    def take(self) -> list[tuple[Job, Queue]]:
        taken, self.held = self.held, []
        return taken


class BatchDequeue:
    """Non-blocking, priority-ordered pops of up to n jobs in one round trip.

    Within one priority the tenants' queues are taken round-robin, and the next pop starts
    after the queue the last one ended on, so no tenant's backlog holds another's jobs back.
    """

    def __init__(
        self, connection: redis.Redis, queues: Sequence[Queue], guard: ColdStopGuard
    ) -> None:
        self.connection = connection
        self.queues = {queue.key: queue for queue in queues}
        by_name = {queue.name: queue.key for queue in queues}
        self.groups = [
            [by_name[name] for name in group]
            for group in tenants.priority_groups([queue.name for queue in queues])
        ]
        self.guard = guard
        self._pop_many = connection.register_script(_POP_MANY)
        self._not_streamed: dict[str, str] = {}  # queue key -> its head, known not streamed

    def _popped_ids(self, n: int) -> list[tuple[Queue, str]]:
        """One script call; each group then turns to start after the last queue it gave."""
        order = [key for group in self.groups for key in group]
        sizes = [len(group) for group in self.groups]
        flat = cast(list[bytes], self._pop_many(keys=order, args=[n, *sizes]))
        pairs = [(as_text(flat[i]), as_text(flat[i + 1])) for i in range(0, len(flat), 2)]
        for key, _ in pairs:
            self.groups = [tenants.rotated_after(group, key) for group in self.groups]
        return [(self.queues[key], job_id) for key, job_id in pairs]

    def pop(self, n: int, into: PoppedJobs, on_unreadable: Callable[[Unreadable], None]) -> int:
        """Pop up to `n` jobs into `into.held` (a cold stop waits meanwhile); returns how many."""
        if n <= 0:
            return 0
        with self.guard.held():
            pairs = self._popped_ids(n)
            added = 0
            for index, (queue, job_id) in enumerate(pairs):
                try:
                    job = CosyqJob.fetch(
                        job_id, connection=self.connection, serializer=JSONSerializer
                    )
                except NoSuchJobError:
                    continue  # deleted after it was queued: RQ skips these too
                except redis.RedisError as e:
                    refuse_or_wait(e)  # a misconfiguration ends the worker; else an outage
                    log.warning("batch_fetch_failed", job_id=job_id, error=str(e))
                    self.push_back_ids(pairs[index:])  # not read: no verdict, back they go
                    break
                except Exception as e:  # a hash that was read and does not decode: refused
                    on_unreadable(Unreadable(e, job_id, queue))
                    continue
                into.held.append((job, queue))
                added += 1
        return added

    def pop_streamed_head(self, into: PoppedJobs) -> bool:
        """With the window full: take the first queue head (priority order) that is a streamed
        job, so it never waits for a row to free up (it runs ahead of the rows, not in one).
        `LREM` is the claim: of two workers peeking at the same head, one gets it. A head that
        is not streamed is remembered and not fetched again; one that will not load is left
        for the ordinary pop to refuse."""
        order = [key for group in self.groups for key in group]
        with self.connection.pipeline(transaction=False) as pipe:
            for key in order:
                pipe.lindex(key, 0)
            heads = pipe.execute()
        with self.guard.held():
            for key, raw in zip(order, heads, strict=True):
                if raw is None or self._not_streamed.get(key) == as_text(raw):
                    continue
                job_id = as_text(raw)
                try:
                    job = CosyqJob.fetch(
                        job_id, connection=self.connection, serializer=JSONSerializer
                    )
                except redis.RedisError:
                    raise  # an outage: the caller waits it out
                except Exception:
                    continue
                if not streamed(job):
                    self._not_streamed[key] = job_id
                    continue
                if self.connection.lrem(key, 1, job_id) == 1:
                    into.held.append((job, self.queues[key]))
                    return True
        return False

    def push_back_popped(self, popped: Sequence[tuple[Job, Queue]]) -> None:
        """Put popped, unstarted jobs back at the head of their queues, first one first."""
        self.push_back_ids([(queue, job.id) for job, queue in popped])

    def push_back_ids(self, popped: Sequence[tuple[Queue, str]]) -> None:
        """As `push_back_popped`, for ids whose hashes were not read; waits out an outage."""
        if not popped:
            return

        def push() -> None:
            with self.connection.pipeline() as pipe:  # MULTI: a retry never pushes twice
                for queue, job_id in reversed(popped):
                    pipe.lpush(queue.key, job_id)
                pipe.execute()

        until_reachable(push, "job_push_back_failed")  # a popped job must not be dropped
        for queue, job_id in popped:
            log.info("job_pushed_back", job_id=job_id, queue=queue.name)


def admission_room(
    *, batch_size: int, held: int, jobs_left: int, open_: bool, beside: int = 0
) -> int:
    """How many more jobs may join now: the batch size counts every job held but the `beside`
    ones (run, or waiting their turn, alone beside the batch: they hold no row), and the jobs
    this process may still take (recycling budget) count every job held, so a worker never
    takes a job it would have to give back for recycling."""
    if not open_:
        return 0
    return max(0, min(batch_size + beside, jobs_left) - held)
