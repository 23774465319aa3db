"""After a warm stop, a wait for an unreachable Redis ends at the bound (issue 45 item 13);
before one, and for a new worker after one, it does not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NoReturn

import pytest
import redis

from workers.service import outage, outcomes


class GaveUp(Exception):
    pass


def give_up(event: str) -> NoReturn:
    raise GaveUp(event)


def unreachable() -> None:
    raise redis.ConnectionError("Connection refused")


@pytest.fixture
def bound() -> Iterator[outage.StopBound]:
    yield outage.STOP_BOUND
    outage.STOP_BOUND.disarm()


def test_every_wait_for_redis_gives_up_once_a_stop_is_past_its_bound(
    bound: outage.StopBound,
) -> None:
    bound.arm(0.0, give_up)
    with pytest.raises(GaveUp, match="job_push_back_failed"):
        outage.until_reachable(unreachable, "job_push_back_failed")
    with pytest.raises(GaveUp, match="job_outcome_unrecorded"):
        outcomes.when_reachable(unreachable, job_id="j1", step="success")


def test_the_first_signal_sets_the_bound_and_disarm_clears_it(bound: outage.StopBound) -> None:
    assert bound.left_s() == float("inf")
    bound.arm(30.0, give_up)
    bound.arm(0.0, give_up)  # a second signal is the cold stop, not a new bound
    assert 29.0 < bound.left_s() <= 30.0
    bound.check("waiting")  # within the bound: nothing happens
    bound.disarm()
    assert bound.left_s() == float("inf")
    assert outage.until_reachable(lambda: 7, "waiting") == 7
