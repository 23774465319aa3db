"""The settings of the producer-side services: the HTTP front and webhook delivery.

A mixin of `shared.settings.Settings` (fields only, read from COSYQ_* like every other), kept
apart so the one Settings class stays readable.
"""

from __future__ import annotations

import base64
import binascii

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator

from shared.errors import SettingsError
from shared.tenants import parse_api_keys, parse_operator_keys

WEBHOOK_SECRET_PREFIX = "whsec_"


class FrontSettings(BaseModel):
    # HTTP front (`cosyq serve`, extra cosyq[http])
    api_keys: SecretStr | None = Field(
        None,
        description="comma-separated bearer keys of the HTTP front, each `tenant:key` or a "
        "plain key (tenant default); unset: loopback only",
    )
    operator_keys: SecretStr | None = Field(
        None,
        description="comma-separated bearer keys of operators: tenant default for what they "
        "submit, and may read every tenant's jobs and documents, manage shared voices and read "
        "/metrics with tenant labels",
    )
    metrics_public_queue_depth: bool = Field(
        False,
        description="a keyless GET /metrics of a front with keys also serves cosyq_queue_depth "
        "per priority queue, every tenant's jobs summed: reveals the tenants' combined depth to "
        "anyone who reaches the front (false: no key gets the worker gauges only)",
    )
    http_wait_timeout_s: float = Field(
        60.0, gt=0, description="longest POST /v1/audio/speech waits for its job before a 504"
    )
    http_max_waits: int = Field(
        64,
        gt=0,
        description="most requests one `cosyq serve` process holds waiting at once, all "
        "tenants (its asyncio Redis pool holds 32 connections more, for every other request)",
    )
    http_max_body_bytes: int = Field(
        2 * 1024 * 1024, gt=0, description="largest JSON request body (a batch of jobs included)"
    )
    http_max_json_values: int = Field(
        131072,
        gt=0,
        description="most values and keys a JSON request body may hold (each `[` or `{` one "
        "more), counted before it is parsed: parsing holds the front's event loop, and 2 MB of "
        "`[],[],...` took it for ~0.2 s, every tenant's requests waiting",
    )
    http_max_upload_bytes: int = Field(
        16 * 1024 * 1024,
        gt=0,
        description=(
            "largest voice upload (POST /v1/audio/voices) from a caller with a key (without: "
            "COSYQ_HTTP_MAX_BODY_BYTES, and answered from its headers)"
        ),
    )
    http_request_read_timeout_s: float = Field(
        60.0,
        gt=0,
        description="longest a request (headers and body) may take to arrive; a slower client "
        "is answered 408 and disconnected (slow-loris)",
    )
    http_max_batch: int = Field(1000, gt=0, description="most requests in one POST /v1/jobs:batch")
    http_retry_after_s: int = Field(
        5, ge=0, description="the Retry-After of a 429 (a queue at COSYQ_MAX_QUEUE_DEPTH)"
    )
    http_auth_failures_per_minute: int = Field(
        30,
        ge=0,
        description="most wrong keys (API or /ui sign-in) one client address may send per "
        "minute; past it that address is refused 429, its right keys too (0: no limit)",
    )
    # The operator's page at /ui (producer/http/ui/)
    ui_session_ttl_s: int = Field(
        8 * 3600, gt=0, description="how long a /ui sign-in lasts (its session in Redis)"
    )
    ui_max_form_bytes: int = Field(
        4096,
        gt=0,
        description="largest /ui form post (sign-in, judging, a document's buttons), read only "
        "after its caller is judged (the sign-in form's: after its address)",
    )
    ui_page_size: int = Field(50, gt=0, le=500, description="rows per page of the /ui lists")
    ui_scan_limit: int = Field(
        2000,
        gt=0,
        description="most index entries one filtered /ui list page reads to fill its rows",
    )

    # Webhooks (a request's `webhook`; delivered by `cosyq webhooks run` or `cosyq serve`)
    webhook_allowed_urls: str | None = Field(
        None,
        description="comma-separated URL prefixes a request's webhook may name (unset: "
        "webhooks refused)",
    )
    webhook_secret: SecretStr | None = Field(
        None, description="the Standard Webhooks signing secret (whsec_ + base64)"
    )
    webhook_allow_private: bool = Field(
        False,
        description="accept and deliver webhooks to loopback, private and link-local addresses "
        "too (tests, a receiver on the same host)",
    )
    webhook_timeout_s: float = Field(
        10.0, gt=0, description="one delivery's whole deadline: connect, send, answer, all of it"
    )
    webhook_retry_hours: float = Field(
        24.0, gt=0, description="how long a failing delivery is retried before it is dead"
    )
    webhook_backoff_s: float = Field(
        5.0, gt=0, description="first pause before a failed delivery is tried again (doubles)"
    )
    webhook_backoff_max_s: float = Field(
        3600.0, gt=0, description="longest pause between tries of one delivery"
    )
    webhook_concurrency: int = Field(
        8, gt=0, description="deliveries one dispatcher makes at once (slow receivers wait alone)"
    )
    webhook_receiver_concurrency: int = Field(
        2,
        gt=0,
        description="deliveries one dispatcher makes at once to one receiver (a URL's scheme, "
        "host and port): a slow receiver holds at most these slots, its other events wait",
    )
    webhook_event_memory_hours: float = Field(
        72.0,
        gt=0,
        description="how long an event's webhook id is remembered, so a job that ends twice "
        "(its worker killed mid-record) is told once, and how long a job event's body is kept "
        "for a dispatcher that is down",
    )
    webhook_claim_idle_s: float = Field(
        60.0, gt=0, description="a delivery read by a dispatcher that died is taken over after"
    )
    webhook_poll_s: float = Field(
        0.5,
        gt=0,
        description="longest one read of the outbox waits: how soon a dispatcher notices a "
        "stop or a retry come due",
    )
    webhook_dispatch_in_serve: bool = Field(
        False, description="`cosyq serve` also runs a webhook dispatcher"
    )

    @field_validator("webhook_allowed_urls")
    @classmethod
    def _check_webhook_allowed_urls(cls, value: str | None) -> str | None:
        """Each prefix starts http:// or https://: one without (`hooks.example.com`) admits no
        webhook at all, which a request learned only as "not under any prefix"."""
        parts = [part.strip() for part in (value or "").split(",") if part.strip()]
        for number, prefix in enumerate(parts, start=1):
            if not prefix.lower().startswith(("http://", "https://")):
                raise ValueError(f"entry {number} does not start with http:// or https://")
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _check_webhook_secret(cls, value: SecretStr | None) -> SecretStr | None:
        """Strict base64: the signer's own decoding drops what is not base64 (a weaker key
        than written) and fails on a non-ASCII character with that character in its message.
        A key left empty after the prefix (`whsec_` alone) is refused: anyone could sign."""
        if value is not None and not value.get_secret_value():
            return None  # `COSYQ_WEBHOOK_SECRET=` is unset, as for the keys
        if value is not None:
            raw = value.get_secret_value().removeprefix(WEBHOOK_SECRET_PREFIX)
            try:
                base64.b64decode(raw.encode("ascii"), validate=True)
            except (UnicodeEncodeError, binascii.Error):
                raise ValueError("must be whsec_ followed by base64 (see README)") from None
            if not raw:
                raise ValueError("has no key after whsec_ (see README)")
        return value

    @field_validator("operator_keys")
    @classmethod
    def _check_operator_keys(
        cls, value: SecretStr | None, info: ValidationInfo
    ) -> SecretStr | None:
        """A field error (its input is masked): the message names the entry, never the key."""
        if value is not None:
            tenant_keys = info.data.get("api_keys")
            raw_tenant_keys = tenant_keys.get_secret_value() if tenant_keys is not None else ""
            try:
                parse_operator_keys(value.get_secret_value(), parse_api_keys(raw_tenant_keys))
            except SettingsError as e:
                raise ValueError(str(e)) from e
        return value

    def operator_key_list(self) -> tuple[str, ...]:
        """The HTTP front's operator keys (COSYQ_OPERATOR_KEYS); none is a tenant's key."""
        if self.operator_keys is None:
            return ()
        tenant_keys = (
            () if self.api_keys is None else parse_api_keys(self.api_keys.get_secret_value())
        )
        return parse_operator_keys(self.operator_keys.get_secret_value(), tenant_keys)
