"""The webhook dispatcher when something goes wrong that nobody foresaw, against a real Redis
and a real HTTP receiver: an unexpected error in one delivery is logged once and that delivery
tried again; the outbox deleted under a running dispatcher is logged and the dispatcher goes on.
Neither vanishes in a thread."""

from __future__ import annotations

import json

import redis
from structlog.testing import capture_logs

from producer.webhooks.store import WebhookStore
from shared import keys
from shared.settings import Settings
from shared.webhooks import WebhookEvent
from tests.doubles.harness import wait_for
from tests.doubles.webhook_receiver import Receiver
from tests.integration.producer.webhook_rig import (  # noqa: F401 (fixtures used by name)
    SECRET,
    append,
    connection_fixture,
    dispatching,
    event,
    receiver_fixture,
    settings_fixture,
)


def test_an_unexpected_error_in_a_delivery_is_logged_and_the_event_still_delivered(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    """The body builder raises what nobody foresaw on the first try: the error is logged once
    (its type and message, a URL's credentials redacted), the try counts as a failed one, and
    the event is delivered on a later try."""
    tries: list[str] = []

    def body_of(made: WebhookEvent) -> str:
        tries.append(made.job_id)
        if len(tries) == 1:
            raise RuntimeError("no body from https://ops:s3cret@status.example/x")
        return json.dumps({"job_id": made.job_id})

    append(connection, event(receiver))
    with capture_logs() as logs, dispatching(connection, settings, {}, body_of=body_of):
        wait_for(lambda: len(receiver.calls) == 1, 30, "the event delivered")
        wait_for(lambda: WebhookStore(connection).counts() == (0, 0), 10, "the outbox empty")
    crashed = [line for line in logs if line["event"] == "webhook_delivery_crashed"]
    assert len(crashed) == 1
    assert crashed[0]["webhook_id"] == "msg_job-1_finished"
    assert crashed[0]["error_type"] == "RuntimeError"
    assert "s3cret" not in json.dumps(crashed, default=str)
    assert "status.example" in crashed[0]["error"]
    assert SECRET not in json.dumps(logs, default=str)
    assert len(tries) == 2


def test_a_dispatcher_whose_outbox_was_deleted_logs_it_and_goes_on(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    """The outbox deleted under a running dispatcher (an operator's DEL or FLUSHDB): its reads
    fail (NOGROUP). The error is logged, the group made again, and the next event delivered:
    the dispatcher's thread does not die without a word."""
    append(connection, event(receiver, "job-1"))
    bodies = {"job-1": {"job_id": "job-1"}, "job-2": {"job_id": "job-2"}}
    with capture_logs() as logs, dispatching(connection, settings, bodies):
        wait_for(lambda: len(receiver.calls) == 1, 30, "the first event delivered")
        connection.delete(keys.WEBHOOK_OUTBOX)
        failed = lambda: [x for x in logs if x["event"] == "webhook_dispatch_failed"]  # noqa: E731
        wait_for(failed, 30, "the failed read logged")
        append(connection, event(receiver, "job-2"))
        wait_for(lambda: len(receiver.calls) == 2, 30, "the next event delivered")
    assert failed()[0]["error_type"] == "ResponseError"
    assert [c.headers["webhook-id"] for c in receiver.calls] == [
        "msg_job-1_finished",
        "msg_job-2_finished",
    ]
