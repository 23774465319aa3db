"""The webhook dispatcher against a real Redis and a real HTTP receiver: signed per Standard
Webhooks, delivered at least once under one webhook-id, retried with backoff, dead-lettered and
redelivered, never sent to a private address unless allowed, and taken over from a dead
dispatcher. Slow receivers (issue 45 item 8): COSYQ_WEBHOOK_TIMEOUT_S is one deadline for the
whole request, an entry in flight is never taken back by its own dispatcher, one event is never
POSTed twice at once even with two dispatchers, and a slow receiver cannot take every slot."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from standardwebhooks.webhooks import Webhook

from producer import CosyqClient
from producer.cli import main as cosyq
from producer.webhooks.delivery import Sender
from producer.webhooks.records import Delivery
from producer.webhooks.store import WebhookStore
from shared import keys
from shared.errors import InvalidRequestError
from shared.settings import Settings
from shared.webhooks import WebhookEvent, tenant_secret
from tests.doubles.harness import wait_for
from tests.doubles.redis_servers import self_signed
from tests.doubles.webhook_receiver import Receiver, webhook_receiver
from tests.integration.producer.webhook_rig import (  # noqa: F401 (fixtures used by name)
    SECRET,
    append,
    connection_fixture,
    dispatching,
    event,
    receiver_fixture,
    settings_fixture,
)

# A receiver's error answer: clear the screen, set the clipboard (OSC 52), a hidden link (OSC
# 8), C1's CSI and a bidi override.
HOSTILE_ANSWER = "\x1b[2J\x1b]52;c;cHduZWQ\x1b\\\x1b]8;;https://evil.example/\x1b\\x\x9b2J\u202eab"


def test_each_event_is_signed_and_redelivered_under_the_same_id(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    receiver.answers = [500, 503]  # two failed tries, then 200
    body = {"job_id": "job-1", "state": "finished"}
    append(connection, event(receiver))
    with dispatching(connection, settings, {"job-1": body}):
        wait_for(lambda: len(receiver.calls) == 3, 30, "three tries of one event")
        wait_for(lambda: WebhookStore(connection).counts() == (0, 0), 10, "the outbox empty")
    ids = {call.headers["webhook-id"] for call in receiver.calls}
    assert ids == {"msg_job-1_finished"}
    assert len({call.body for call in receiver.calls}) == 1  # the same bytes each time
    for call in receiver.calls:
        assert Webhook(SECRET).verify(call.body, call.headers) == body
    tampered = dict(receiver.calls[0].headers, **{"webhook-id": "msg_other"})
    with pytest.raises(Exception, match="signature"):
        Webhook(SECRET).verify(receiver.calls[0].body, tampered)


def test_each_tenants_events_are_signed_with_its_own_secret(
    connection: redis.Redis,
    settings: Settings,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every tenant's receiver holds a secret: were it one for all, alpha could sign events
    of its own making as beta's. Each named tenant's is its own (`cosyq webhooks secret`);
    the tenant "default" keeps COSYQ_WEBHOOK_SECRET."""
    bodies = {f"job-{t}": {"job_id": f"job-{t}", "tenant": t} for t in ("alpha", "default")}
    for tenant in ("alpha", "default"):
        made = WebhookEvent.for_job(
            "job.finished", f"job-{tenant}", receiver.url, "2026-12-01T00:00Z", tenant
        )
        append(connection, made)
    with dispatching(connection, settings, bodies):
        wait_for(lambda: len(receiver.calls) == 2, 30, "both events delivered")
    calls = {json.loads(call.body)["tenant"]: call for call in receiver.calls}
    alpha, default = calls["alpha"], calls["default"]
    assert Webhook(tenant_secret(SECRET, "alpha")).verify(alpha.body, alpha.headers)
    assert Webhook(SECRET).verify(default.body, default.headers)
    for secret in (SECRET, tenant_secret(SECRET, "beta")):  # nobody else's secret verifies it
        with pytest.raises(Exception, match="signature"):
            Webhook(secret).verify(alpha.body, alpha.headers)
    monkeypatch.setenv("COSYQ_TENANTS", "alpha,beta")
    capsys.readouterr()
    assert cosyq(["--env-file", "/nonexistent", "webhooks", "secret", "alpha"]) == 0
    assert capsys.readouterr().out.strip() == tenant_secret(SECRET, "alpha")
    assert cosyq(["--env-file", "/nonexistent", "webhooks", "secret", "gamma"]) != 0


def test_an_event_of_nobodys_is_never_sent_even_with_its_body(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    """A document planned before tenants is nobody's: its event, which comes with its body,
    is dead-lettered unsent like a job event of nobody's (the body is never checked against
    a job), while a tenant's document event goes."""
    for document_id, tenant in (("doc-old", ""), ("doc-alpha", "alpha")):
        made = WebhookEvent.for_job(
            "document.finished", document_id, receiver.url, "2026-12-01T00:00Z", tenant
        )
        body = json.dumps({"document_id": document_id, "state": "assembled"})
        connection.xadd(keys.WEBHOOK_OUTBOX, {**made.fields(), "body": body})
    with dispatching(connection, settings, {}):
        wait_for(lambda: WebhookStore(connection).counts()[1] == 1, 30, "one dead letter")
        wait_for(lambda: len(receiver.calls) == 1, 30, "alpha's document event")
    assert [json.loads(c.body)["document_id"] for c in receiver.calls] == ["doc-alpha"]
    (dead,) = WebhookStore(connection).dead_letters().values()
    assert "tenant" in json.loads(dead)["dead_reason"]


def test_a_receiver_that_keeps_failing_is_dead_lettered_then_redelivered(
    connection: redis.Redis, settings: Settings, receiver: Receiver, capsys: Any
) -> None:
    settings = settings.model_copy(update={"webhook_retry_hours": 1 / 3600})  # 1 s: 3 tries
    receiver.answers = [500] * 1000
    append(connection, event(receiver))
    store = WebhookStore(connection)
    with dispatching(connection, settings, {"job-1": {"job_id": "job-1"}}):
        wait_for(lambda: store.counts() == (0, 1), 30, "the event dead")
    tries = len(receiver.calls)
    assert tries >= 2
    assert cosyq(["--env-file", "/nonexistent", "webhooks", "failed"]) == 0
    listed = capsys.readouterr().out
    assert "msg_job-1_finished" in listed and "gave up after" in listed
    assert cosyq(["--env-file", "/nonexistent", "webhooks", "failed", "msg_nope"]) == 1
    assert cosyq(["--env-file", "/nonexistent", "webhooks", "failed", "--redeliver"]) == 0
    assert store.counts() == (1, 0)
    receiver.answers = []
    with dispatching(connection, settings, {"job-1": {"job_id": "job-1"}}):
        wait_for(lambda: store.counts() == (0, 0), 30, "the redelivered event delivered")
    assert len(receiver.calls) == tries + 1
    assert {c.headers["webhook-id"] for c in receiver.calls} == {"msg_job-1_finished"}


def test_dead_webhooks_are_listed_with_their_urls_query_masked(
    connection: redis.Redis,
    settings: Settings,
    receiver: Receiver,
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tenant's webhook URL may carry its receiver's token in the query under any name
    (Azure's ?code=): `cosyq webhooks failed` shows the receiver and path, never a value, and
    a receiver's answer that quotes the URL is kept (logged, dead-lettered) with it masked."""
    settings = settings.model_copy(update={"webhook_retry_hours": 1 / 3600})
    receiver.answers = [404] * 1000
    receiver.echo_path = True
    url = receiver.url + "in?code=AZ-CODE-4Kq&token=TOK-9Lw&flag"
    made = WebhookEvent.for_job("job.finished", "job-1", url, "2026-12-01T00:00Z", "default")
    append(connection, made)
    with dispatching(connection, settings, {"job-1": {"job_id": "job-1"}}):
        wait_for(lambda: WebhookStore(connection).counts() == (0, 1), 30, "the event dead")
    assert receiver.calls[0].path.endswith("?code=AZ-CODE-4Kq&token=TOK-9Lw&flag")  # sent whole
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "400")  # the table on one line per row, the URL unfolded
    assert cosyq(["--env-file", "/nonexistent", "webhooks", "failed"]) == 0
    listed = capsys.readouterr().out
    assert "msg_job-1_finished" in listed and "in?code=***&token=***&***" in listed
    assert "HTTP 404: no route for POST /hooks/in?***" in listed
    (dead,) = WebhookStore(connection).dead_letters().values()
    record = json.loads(dead)  # its event keeps the URL whole, to be redelivered
    for shown in (listed, record["last_error"], record["dead_reason"]):
        assert "AZ-CODE-4Kq" not in shown and "TOK-9Lw" not in shown


def test_a_receivers_terminal_escapes_are_listed_escaped(
    connection: redis.Redis,
    settings: Settings,
    receiver: Receiver,
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tenant runs its receiver: its error answer is kept in the dead letter as it came, and
    `cosyq webhooks failed` shows it to the operator with ESC (clear the screen, OSC 52 set
    the clipboard, OSC 8 hide a link), C1 CSI and bidi overrides written as escapes."""
    settings = settings.model_copy(update={"webhook_retry_hours": 1 / 3600})
    receiver.answers = [500] * 1000
    receiver.error_body = HOSTILE_ANSWER.encode()
    append(connection, event(receiver))
    with dispatching(connection, settings, {"job-1": {"job_id": "job-1"}}):
        wait_for(lambda: WebhookStore(connection).counts() == (0, 1), 30, "the event dead")
    (dead,) = WebhookStore(connection).dead_letters().values()
    assert HOSTILE_ANSWER in json.loads(dead)["dead_reason"]  # kept as it came
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "400")
    assert cosyq(["--env-file", "/nonexistent", "webhooks", "failed"]) == 0
    listed = capsys.readouterr().out
    for control in ("\x1b", "\x9b", "\u202e"):
        assert control not in listed
    assert "\\u001b]52;c;cHduZWQ\\u001b" in listed and "\\u202e" in listed


def test_a_private_address_is_never_called_unless_allowed(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    settings = settings.model_copy(update={"webhook_allow_private": False})
    append(connection, event(receiver))
    store = WebhookStore(connection)
    with dispatching(connection, settings, {"job-1": {}}):
        wait_for(lambda: store.counts() == (0, 1), 30, "the event refused")
    assert receiver.calls == []
    (record,) = store.dead_letters().values()
    assert "127.0.0.1 is loopback" in json.loads(record)["dead_reason"]


def test_redirects_are_not_followed(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    receiver.answers = [302]
    append(connection, event(receiver))
    with dispatching(connection, settings, {"job-1": {}}):
        wait_for(lambda: WebhookStore(connection).counts() == (0, 0), 30, "delivery on retry")
    assert [c.path for c in receiver.calls] == ["/hooks/", "/hooks/"]  # never /hooks/redirected


def test_a_slow_receiver_does_not_hold_up_another(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    with webhook_receiver() as slow:
        slow.delay_s = 0.75  # under the 2 s timeout: delivered, slowly
        for n in range(3):
            append(connection, event(slow, f"slow-{n}"))
        append(connection, event(receiver, "quick"))
        bodies = {f"slow-{n}": {} for n in range(3)} | {"quick": {}}
        started = time.monotonic()
        with dispatching(connection, settings, bodies):
            wait_for(lambda: receiver.calls, 10, "the quick receiver called")
            quick_after = time.monotonic() - started
            wait_for(lambda: len(slow.calls) == 3, 30, "the slow receiver's three")
    assert quick_after < 0.75 * 3  # not after the slow receiver's three, one by one


def test_an_event_a_dead_dispatcher_read_is_taken_over(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    store = WebhookStore(connection)
    store.ensure_group()
    append(connection, event(receiver))
    assert len(store.read_new("died-mid-delivery", 10, 100)) == 1  # read, never acknowledged
    pending = connection.xpending(keys.WEBHOOK_OUTBOX, keys.WEBHOOK_GROUP)
    assert pending["pending"] == 1
    # taken over once idle for the claim-idle: 1.5 s here (over a 1 s timeout, as the
    # settings require), the receiver answering at once
    settings = settings.model_copy(update={"webhook_timeout_s": 1.0, "webhook_claim_idle_s": 1.5})
    with dispatching(connection, settings, {"job-1": {}}):
        wait_for(lambda: receiver.calls, 30, "the event delivered by the second dispatcher")
        wait_for(lambda: store.counts() == (0, 0), 10, "the outbox empty")
    assert connection.xpending(keys.WEBHOOK_OUTBOX, keys.WEBHOOK_GROUP)["pending"] == 0


def test_status_counts_waiting_and_dead_webhooks(
    connection: redis.Redis, settings: Settings, receiver: Receiver, capsys: Any, tmp_path: Path
) -> None:
    append(connection, event(receiver))
    assert cosyq(["--env-file", "/nonexistent", "status"]) == 0
    assert "webhooks: 1 waiting to be delivered, 0 dead" in capsys.readouterr().out


@pytest.fixture
def trickling() -> Iterator[Receiver]:
    with webhook_receiver() as made:
        made.trickle_s = 1.0  # one byte a second, for ever: each read alone is quick
        yield made


def failed_tries(connection: redis.Redis) -> list[dict[str, object]]:
    """The deliveries waiting for their next try, with their last error."""
    return [json.loads(member) for member in connection.zrange(keys.WEBHOOK_RETRY, 0, -1)]


def test_a_trickling_receiver_is_cut_off_at_the_deadline(
    connection: redis.Redis, settings: Settings, trickling: Receiver
) -> None:
    settings = settings.model_copy(update={"webhook_backoff_s": 600.0})  # one try only
    append(connection, event(trickling))
    with dispatching(connection, settings, {"job-1": {}}):
        wait_for(lambda: failed_tries(connection), 30, "the first try cut off")
    (waiting,) = failed_tries(connection)
    assert waiting["tries"] == 1
    assert "deadline (COSYQ_WEBHOOK_TIMEOUT_S) passed" in str(waiting["last_error"])
    wait_for(lambda: trickling.cut_off == 1, 10, "the receiver to see the hang-up")
    assert len(trickling.calls) == 1


def test_two_dispatchers_never_post_one_event_twice_at_once(
    connection: redis.Redis, settings: Settings, trickling: Receiver
) -> None:
    # Timeout 2 s, claim-idle 3 s: a try that outlived the claim-idle would be taken over
    # (by the other dispatcher or by its own) while it still trickles.
    append(connection, event(trickling))
    bodies: dict[str, Any] = {"job-1": {}}
    with dispatching(connection, settings, bodies), dispatching(connection, settings, bodies):
        wait_for(lambda: trickling.cut_off >= 3, 60, "three tries, each cut off")
    assert trickling.most_held_one_id == 1
    assert {c.headers["webhook-id"] for c in trickling.calls} == {"msg_job-1_finished"}


def test_an_entry_in_flight_is_never_taken_back_by_its_own_dispatcher(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    """The body is slow to build (longer than the claim-idle): the dispatcher's next look at
    stale entries finds its own entry, and must leave it to the try in hand."""
    release = threading.Event()
    built: list[str] = []

    def slow_body(made: WebhookEvent) -> str:
        built.append(made.job_id)
        release.wait(30)
        return json.dumps({"job_id": made.job_id})

    append(connection, event(receiver))
    dispatcher_settings = settings.model_copy(update={"webhook_claim_idle_s": 0.5})
    with dispatching(connection, dispatcher_settings, {}, body_of=slow_body):
        wait_for(lambda: _times_claimed(connection) >= 2, 30, "a look at stale entries")
        release.set()
        wait_for(lambda: WebhookStore(connection).counts() == (0, 0), 30, "the event delivered")
    assert built == ["job-1"]
    assert len(receiver.calls) == 1


def test_a_slow_receiver_cannot_take_every_slot(
    connection: redis.Redis, settings: Settings, receiver: Receiver, trickling: Receiver
) -> None:
    settings = settings.model_copy(
        update={
            "webhook_concurrency": 3,
            "webhook_receiver_concurrency": 1,
            "webhook_timeout_s": 30.0,
            "webhook_claim_idle_s": 60.0,
        }
    )
    for n in range(3):
        append(connection, event(trickling, f"slow-{n}"))
    append(connection, event(receiver, "quick"))
    bodies = {f"slow-{n}": {} for n in range(3)} | {"quick": {}}
    with dispatching(connection, settings, bodies):
        wait_for(lambda: receiver.calls, 20, "the quick receiver told while the slow one holds")
        assert trickling.cut_off == 0  # no slow try has ended: the quick one did not wait
        # Checked: now end the slow answers, or the dispatcher's stop waits out the try in
        # flight (the 30 s deadline that kept every slow try from ending above).
        trickling.closing.set()
    assert trickling.most_held == 1


def _times_claimed(connection: redis.Redis) -> int:
    pending = connection.xpending_range(keys.WEBHOOK_OUTBOX, keys.WEBHOOK_GROUP, "-", "+", 10)
    return max((int(entry["times_delivered"]) for entry in pending), default=0)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://localhost:9/hook", "localhost resolves to .*, which is loopback"),
        ("http://[64:ff9b::a9fe:a9fe]/hook", r"is link-local \(it embeds 169.254.169.254\)"),
        ("http://[::ffff:10.0.0.1]/hook", r"is private \(it embeds 10.0.0.1\)"),
    ],
)
def test_the_client_refuses_a_private_webhook_at_submit(
    connection: redis.Redis, settings: Settings, url: str, why: str
) -> None:
    """Issue 44 item 8: the client learns at once, and nothing is queued."""
    settings = settings.model_copy(
        update={"webhook_allow_private": False, "webhook_allowed_urls": "http://"}
    )
    with CosyqClient(settings) as client:
        with pytest.raises(InvalidRequestError, match="webhook: .*" + why):
            client.submit({"text": "hi", "webhook": {"url": url}})
        allowed = settings.model_copy(update={"webhook_allow_private": True})
        with CosyqClient(allowed) as trusting:
            assert trusting.submit({"text": "hi", "webhook": {"url": url}})
    assert connection.llen("rq:queue:cosyq-default") == 1  # only the allowed one


def test_the_dispatcher_connects_to_the_address_it_checked_under_the_host_name(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    """A name is resolved once and judged; the POST keeps the name in its Host header. Under
    the default policy the same name (loopback) and a NAT64 form of the metadata address are
    dead-lettered unsent (issue 44 item 8)."""
    port = receiver.url.split(":")[2].split("/")[0]
    named = WebhookEvent.for_job(
        "job.finished", "job-1", f"http://localhost:{port}/hooks/", "2026-12-01T00:00Z", "default"
    )
    append(connection, named)
    with dispatching(connection, settings, {"job-1": {}}):
        wait_for(lambda: receiver.calls, 30, "the named receiver called")
    assert receiver.calls[0].headers["Host"] == f"localhost:{port}"
    strict = settings.model_copy(update={"webhook_allow_private": False})
    nat64 = WebhookEvent.for_job(
        "job.finished", "job-2", "http://[64:ff9b::a9fe:a9fe]/", "2026-12-01T00:00Z", "default"
    )
    append(connection, nat64)
    again = WebhookEvent.for_job("job.failed", "job-1", named.url, named.at, "default")
    append(connection, again)
    store = WebhookStore(connection)
    with dispatching(connection, strict, {"job-1": {}, "job-2": {}}):
        wait_for(lambda: store.counts() == (0, 2), 30, "both refused")
    assert len(receiver.calls) == 1
    reasons = sorted(json.loads(r)["dead_reason"] for r in store.dead_letters().values())
    assert "64:ff9b::a9fe:a9fe is link-local (it embeds 169.254.169.254)" in reasons[0]
    assert "localhost resolves to 127.0.0.1, which is loopback" in reasons[1]


def test_tls_checks_the_host_name_though_the_socket_goes_to_the_checked_address(
    tmp_path: Path,
) -> None:
    """The connection is opened to the address resolved and checked, and TLS still sends the
    name (SNI) and checks the certificate against it: a certificate for `localhost` passes by
    name and fails by address (issue 44 item 8)."""
    cert, key = self_signed(tmp_path, "localhost")
    trusted = ssl.create_default_context(cafile=str(cert))
    sender = Sender(SECRET, timeout_s=10, allow_private=True, ssl_context=trusted)
    with webhook_receiver(tls=(cert, key)) as secure:
        port = secure.url.split(":")[2].split("/")[0]
        for host, delivered in (("localhost", True), ("127.0.0.1", False)):
            made = WebhookEvent.for_job(
                "job.finished", "j", f"https://{host}:{port}/h", "2026-12-01T00:00Z", "default"
            )
            answer = sender.send(Delivery(made, "{}", 0, time.time()))
            assert answer.delivered is delivered, answer.error
        assert "CERTIFICATE_VERIFY_FAILED" in answer.error
    sender.close()
    assert [call.headers["Host"] for call in secure.calls] == [f"localhost:{port}"]


def test_an_answered_event_is_booked_once_redis_is_back_never_sent_again(
    settings: Settings, tmp_path: Path
) -> None:
    """Redis goes away while the receiver holds the POST, and the receiver answers 2xx: the
    dispatcher waits Redis out to book the delivery. Left pending, the entry would be claimed
    again after COSYQ_WEBHOOK_CLAIM_IDLE_S and sent to a receiver that already took it."""
    from workers.tools.local_redis import LocalRedis  # noqa: PLC0415

    with LocalRedis(tmp_path / "redis", persistent=True) as server, webhook_receiver() as receiver:
        connection = redis.Redis.from_url(server.url)
        store = WebhookStore(connection)
        append(connection, event(receiver))
        receiver.on_post = server.stop  # Redis is down when the 200 comes back
        with dispatching(
            connection, settings.model_copy(update={"redis_url": server.url}), {"job-1": {}}
        ):
            wait_for(lambda: receiver.calls, 30, "the delivery")
            receiver.on_post = None
            server.start()
            wait_for(lambda: store.counts() == (0, 0), 30, "the delivery booked")
        connection.close()
    assert len(receiver.calls) == 1
