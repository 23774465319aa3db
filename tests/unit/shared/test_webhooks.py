"""A request's webhook: the URLs it may name, checked at the gate; the outbox event's fields."""

from __future__ import annotations

import pytest
from standardwebhooks.webhooks import Webhook

from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits, validate_request
from shared.webhooks import WebhookEvent, allowed_prefixes, check_webhook_url, tenant_secret

ALLOWED = ("https://hooks.example.com/cosyq/", "http://10.0.0.5:8080/")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://evil.example.com/cosyq/", "not under any prefix"),
        ("https://hooks.example.com/other", "not under any prefix"),
        ("https://hooks.example.com.evil.net/cosyq/", "not under any prefix"),
        ("ftp://hooks.example.com/cosyq/", "http:// or https://"),
        ("https:///cosyq/", "http:// or https://"),
        ("https://user:pw@hooks.example.com/cosyq/", "user name or password"),
        ("https://hooks.example.com/cosyq/#x", "no fragment"),
        ("https://hooks.example.com/cosyq/ a", "spaces or control"),
        ("https://hooks.example.com/cosyq/\r\nX: y", "spaces or control"),
    ],
)
def test_a_webhook_url_outside_the_allow_list_is_refused_saying_why(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_webhook_url(url, ALLOWED)


def test_allowed_urls_pass_and_no_allow_list_means_no_webhooks() -> None:
    assert check_webhook_url("https://hooks.example.com/cosyq/done", ALLOWED)
    assert check_webhook_url("http://10.0.0.5:8080/x", ALLOWED, allow_private=True)
    with pytest.raises(ValueError, match=r"10\.0\.0\.5 is private"):
        check_webhook_url("http://10.0.0.5:8080/x", ALLOWED)
    with pytest.raises(ValueError, match="COSYQ_WEBHOOK_ALLOWED_URLS is empty"):
        check_webhook_url("https://hooks.example.com/cosyq/", ())
    assert allowed_prefixes(" https://a/ , ,http://b/") == ("https://a/", "http://b/")
    assert allowed_prefixes(None) == ()


def test_the_gate_names_the_webhook_field_and_rule() -> None:
    limits = RequestLimits(webhook_allowed_urls=ALLOWED)
    request = validate_request(
        {"text": "hi", "webhook": {"url": "https://hooks.example.com/cosyq/1"}}, limits
    )
    assert request.webhook is not None and request.webhook.url.endswith("/cosyq/1")
    for webhook, message in (
        ({"url": "https://evil.example.com/"}, "webhook: not under any prefix"),
        ({"url": "https://hooks.example.com/cosyq/", "secret": "x"}, "webhook.secret: unknown"),
        ("https://hooks.example.com/cosyq/", "webhook: input should be a valid dictionary"),
        ({"url": "x" * 3000}, "webhook.url: "),
    ):
        with pytest.raises(InvalidRequestError, match=message.replace(".", r"\.")):
            validate_request({"text": "hi", "webhook": webhook}, limits)
    with pytest.raises(InvalidRequestError, match="webhook: webhooks are not enabled"):
        validate_request(
            {"text": "hi", "webhook": {"url": "https://hooks.example.com/"}}, RequestLimits()
        )


def test_an_event_id_names_job_and_outcome_never_the_attempt_and_survives_its_fields() -> None:
    event = WebhookEvent.for_job("job.failed", "j1", "https://h/", "2026-12-01T00:00:00Z", "a")
    assert event.webhook_id == "msg_j1_failed"
    assert event.tenant == "a"
    assert WebhookEvent.from_fields(event.fields()) == event
    old = {k: v for k, v in event.fields().items() if k != "tenant"}  # before tenants
    assert WebhookEvent.from_fields(old).tenant == ""  # nobody's: the dispatcher never sends it
    with pytest.raises(ValueError, match="unknown webhook event"):
        WebhookEvent.from_fields({**event.fields(), "event": "job.exploded"})


def test_each_tenant_signs_with_its_own_secret_derived_from_the_one_configured() -> None:
    secret = "whsec_" + "c2VjcmV0LWZvci10ZXN0cy1vbmx5LTMyLWJ5dGVzISE="
    assert tenant_secret(secret, "default") == secret  # as before tenants
    derived = {tenant: tenant_secret(secret, tenant) for tenant in ("a", "a-b", "alpha", "beta")}
    assert len(set(derived.values()) | {secret}) == 5
    assert tenant_secret(secret, "alpha") == derived["alpha"]  # every dispatcher agrees
    for value in derived.values():
        assert value.startswith("whsec_")
        Webhook(value)  # a Standard Webhooks secret a receiver can use


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com.evil.net/cosyq",
        "https://hooks.example.com:8443/cosyq",
        "https://hooks.example.comx/",
        "http://hooks.example.com/",
    ],
)
def test_a_prefix_without_its_slash_admits_no_other_host_or_port(url: str) -> None:
    with pytest.raises(ValueError, match="not under any prefix"):
        check_webhook_url(url, ("https://hooks.example.com",))


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com",
        "https://hooks.example.com/cosyq/done",
        "https://hooks.example.com:443/cosyq",
        "https://hooks.example.com?x=1",
    ],
)
def test_a_prefix_without_its_slash_admits_its_own_host(url: str) -> None:
    assert check_webhook_url(url, ("https://hooks.example.com",)) == url


def test_a_prefix_of_a_scheme_alone_admits_any_host_of_that_scheme() -> None:
    assert check_webhook_url("https://anywhere.example.net/x", ("https://",))
    with pytest.raises(ValueError, match="not under any prefix"):
        check_webhook_url("http://anywhere.example.net/x", ("https://",))
