"""Dead webhooks are kept COSYQ_FAILURE_TTL_S, as a failed job is, then the dispatcher drops
them: the dead-letter hash held every tenant's dead event (its URL, its reason) for ever, one
field a dead webhook, with no way to clear it but `--redeliver`."""

from __future__ import annotations

import json

import redis

from producer.webhooks.store import WebhookStore
from shared import keys
from shared.settings import Settings
from tests.doubles.harness import wait_for
from tests.doubles.webhook_receiver import Receiver
from tests.integration.producer.webhook_rig import (  # noqa: F401 (fixtures used by name)
    append,
    connection_fixture,
    dispatching,
    event,
    receiver_fixture,
    settings_fixture,
)


def test_a_dead_webhook_is_dropped_once_the_failure_ttl_has_passed(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    """One dead now, one an older release left (no time of death): both go once they are
    COSYQ_FAILURE_TTL_S (1 s here) dead, and a dispatcher that keeps running drops them."""
    settings = settings.model_copy(
        update={"webhook_retry_hours": 1 / 3600, "failure_ttl_s": 1}  # 1 s of tries, 1 s dead
    )
    connection.hset(keys.WEBHOOK_DEAD, "msg_old_finished", json.dumps({"dead_reason": "old"}))
    receiver.answers = [500] * 1000
    append(connection, event(receiver))
    store = WebhookStore(connection)
    with dispatching(connection, settings, {"job-1": {"job_id": "job-1"}}):
        wait_for(lambda: store.counts()[0] == 0, 30, "the event dead")
        wait_for(lambda: store.counts() == (0, 0), 30, "the dead letters dropped")
    assert not connection.exists(keys.WEBHOOK_DEAD, keys.WEBHOOK_DEAD_AT)


def test_a_redelivered_dead_webhook_leaves_no_time_of_death_behind(
    connection: redis.Redis, receiver: Receiver
) -> None:
    store = WebhookStore(connection)
    append(connection, event(receiver))
    store.ensure_group()
    [(entry_id, _)] = store.read_new("me", 1, 100)
    store.dead(entry_id, "msg_job-1_finished", json.dumps({"dead_reason": "test"}))
    assert connection.zcard(keys.WEBHOOK_DEAD_AT) == 1
    assert store.redeliver("msg_job-1_finished")
    assert not connection.exists(keys.WEBHOOK_DEAD, keys.WEBHOOK_DEAD_AT)
