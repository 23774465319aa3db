"""Counts in messages agree with their noun: "1 segment", "2 segments"."""

from __future__ import annotations

from producer.room import Room
from shared.plurals import counted


def test_one_is_singular_and_every_other_count_plural() -> None:
    assert counted(1, "segment") == "1 segment"
    assert [counted(n, "job") for n in (0, 2, 2000)] == ["0 jobs", "2 jobs", "2,000 jobs"]
    assert counted(1, "bad line") == "1 bad line" and counted(3, "entry", "entries") == "3 entries"


def test_a_full_queue_or_quota_of_one_job_says_one_job() -> None:
    room = Room(
        tenant="alpha", max_queue_depth=1, max_queued_jobs=1, chunk_size=100, retry_after_s=1
    )
    assert str(room.queue_full("cosyq-default", 1, "none was submitted")).startswith(
        "cosyq-default holds 1 job (COSYQ_MAX_QUEUE_DEPTH 1)"
    )
    assert "tenant alpha has 1 job queued (quota" in str(room.quota_error(1, "none"))
