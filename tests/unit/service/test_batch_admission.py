"""Batch admission: priority-ordered multi-pop, give-back at the head, room, deferred signals."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from workers.service.batch_admission import (
    BatchDequeue,
    ColdStopGuard,
    PoppedJobs,
    Unreadable,
    admission_room,
    batchable,
    synthesis_payload,
)

QUEUE_NAMES = ("cosyq-high", "cosyq-default", "cosyq-low")


@pytest.fixture
def connection(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def queues(connection: redis.Redis) -> list[Queue]:
    return [Queue(name, connection=connection, serializer=JSONSerializer) for name in QUEUE_NAMES]


def enqueue(queue: Queue, text: str) -> str:
    return queue.enqueue("workers.tasks.synthesize", request={"text": text}).id


def no_unreadable(unreadable: Unreadable) -> None:
    raise AssertionError(f"unexpected unreadable job: {unreadable.error}")


def test_pop_takes_up_to_n_in_priority_order(queues: list[Queue], connection: redis.Redis) -> None:
    high, default, low = queues
    low_ids = [enqueue(low, f"low {i}") for i in range(2)]
    default_ids = [enqueue(default, f"default {i}") for i in range(2)]
    high_id = enqueue(high, "high")
    dequeue, popped = BatchDequeue(connection, queues, ColdStopGuard()), PoppedJobs()
    assert dequeue.pop(4, popped, no_unreadable) == 4
    taken = [(job.id, queue.name) for job, queue in popped.take()]
    assert taken == [
        (high_id, "cosyq-high"),
        (default_ids[0], "cosyq-default"),
        (default_ids[1], "cosyq-default"),
        (low_ids[0], "cosyq-low"),
    ]
    assert connection.lrange(low.key, 0, -1) == [low_ids[1].encode()]
    assert dequeue.pop(0, popped, no_unreadable) == 0 and popped.held == []


def test_give_back_restores_the_queue_heads_in_order(
    queues: list[Queue], connection: redis.Redis
) -> None:
    _, default, _ = queues
    ids = [enqueue(default, f"job {i}") for i in range(5)]
    dequeue, popped = BatchDequeue(connection, queues, ColdStopGuard()), PoppedJobs()
    dequeue.pop(3, popped, no_unreadable)
    dequeue.push_back_popped(popped.take())
    assert [i.decode() for i in connection.lrange(default.key, 0, -1)] == ids


def test_missing_and_unreadable_hashes_are_not_held(
    queues: list[Queue], connection: redis.Redis
) -> None:
    _, default, _ = queues
    gone = enqueue(default, "deleted")
    connection.delete(f"rq:job:{gone}")
    broken = enqueue(default, "broken")
    connection.hset(f"rq:job:{broken}", "status", "exploded")  # fails to load: refused
    garbage = enqueue(default, "garbage")
    connection.hset(f"rq:job:{garbage}", "data", b"\x80not json")  # loads; screening refuses
    good = enqueue(default, "good")
    seen: list[Unreadable] = []
    dequeue, popped = BatchDequeue(connection, queues, ColdStopGuard()), PoppedJobs()
    assert dequeue.pop(4, popped, seen.append) == 2
    assert [job.id for job, _ in popped.take()] == [garbage, good]
    assert [(u.job_id, u.queue.name) for u in seen] == [(broken, default.name)]


def test_a_cold_stop_during_the_pop_waits_until_the_jobs_are_held(
    queues: list[Queue], connection: redis.Redis
) -> None:
    """Issue 15's race: a second signal between Redis handing over ids and the worker holding
    them. A busy thread beside the main one, as in a worker (the model, the I/O pool)."""
    _, default, _ = queues
    ids = [enqueue(default, f"job {i}") for i in range(2)]
    guard = ColdStopGuard()
    dequeue, popped = BatchDequeue(connection, queues, guard), PoppedJobs()
    held_at_exit: list[int] = []
    script = dequeue._pop_many

    def pop_then_signal(*args: object, **kwargs: object) -> object:
        result = script(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # lands right after Redis popped the ids
        time.sleep(0.05)  # the handler runs at the next bytecode, inside the pop
        return result

    def cold_exit() -> None:
        held_at_exit.append(len(popped.held))

    def handler(signum: int, frame: FrameType | None) -> None:
        if not guard.defer(cold_exit):
            cold_exit()

    stop = threading.Event()
    beside = threading.Thread(target=stop.wait, daemon=True)
    beside.start()
    dequeue._pop_many = pop_then_signal  # type: ignore[assignment]
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        assert dequeue.pop(2, popped, no_unreadable) == 2
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop.set()
    assert held_at_exit == [2]  # the cold stop ran once both jobs were held, not before
    assert [job.id for job, _ in popped.held] == ids
    assert not guard.defer(cold_exit)  # nothing held any more: a cold stop runs at once


@pytest.mark.parametrize(
    ("batch_size", "held", "jobs_left", "open_", "room"),
    [
        (8, 1, 100, True, 7),
        (8, 8, 100, True, 0),
        (8, 1, 3, True, 2),  # the recycling budget counts held jobs
        (8, 3, 3, True, 0),
        (8, 1, 100, False, 0),  # stopping or retiring: nothing new
        (4, 6, 100, True, 0),
    ],
)
def test_admission_room(batch_size: int, held: int, jobs_left: int, open_: bool, room: int) -> None:
    assert (
        admission_room(batch_size=batch_size, held=held, jobs_left=jobs_left, open_=open_) == room
    )


def test_only_synthesize_jobs_batch_and_their_payload_binds(queues: list[Queue]) -> None:
    _, default, _ = queues
    synth = default.enqueue("workers.tasks.synthesize", request={"text": "hi"})
    voice = default.enqueue("workers.tasks.add_voice", name="v", prompt_audio="file:///p.wav")
    streamed = default.enqueue("workers.tasks.synthesize", request={"text": "hi", "stream": True})
    assert batchable(synth) and not batchable(voice)
    assert not batchable(streamed)  # its chunks go out on its own path, beside the batch
    assert synthesis_payload(synth) == {"text": "hi"}


class BlipOnce(redis.Redis):
    """A real client whose first job read fails as if the connection dropped (a blip)."""

    blips = 1

    def hgetall(self, name: Any) -> Any:
        if self.blips:
            self.blips -= 1
            raise redis.ConnectionError("test: connection dropped while reading a job")
        return super().hgetall(name)


def test_a_redis_error_while_reading_popped_jobs_refuses_none_and_gives_all_back(
    redis_url: str, connection: redis.Redis
) -> None:
    blipping = BlipOnce.from_url(redis_url)
    default = Queue("cosyq-default", connection=connection, serializer=JSONSerializer)
    ids = [enqueue(default, f"job {i}") for i in range(3)]
    queues = [Queue(n, connection=blipping, serializer=JSONSerializer) for n in QUEUE_NAMES]
    popped = PoppedJobs()
    got = BatchDequeue(blipping, queues, ColdStopGuard()).pop(3, popped, no_unreadable)
    assert got == 0 and popped.held == []
    assert [raw.decode() for raw in connection.lrange(default.key, 0, -1)] == ids
    for job_id in ids:
        assert connection.hget(f"rq:job:{job_id}", "status") == b"queued"
    blipping.close()
