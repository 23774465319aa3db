"""One POST of one event: Standard Webhooks headers, no redirects, no private addresses, one
deadline for the whole request.

Signed with the `standardwebhooks` library (`webhook-id`, `webhook-timestamp`,
`webhook-signature` = v1 HMAC-SHA256 of `id.timestamp.body`), so receivers verify with any
Standard Webhooks implementation, each event with its tenant's own secret
(`shared.webhooks.tenant_secret`). The body is frozen at the first try, so a redelivery sends the
same bytes under the same id. Sent with httpcore (which never follows a redirect) over
`connect.CheckedBackend`: the address connected to is the address checked.
"""

from __future__ import annotations

import ssl
import time
from datetime import UTC, datetime
from urllib.parse import parse_qsl, urlsplit

import certifi
import httpcore
from standardwebhooks.webhooks import Webhook

from producer.webhooks.connect import CheckedBackend, deadline
from producer.webhooks.records import ERROR_TEXT_CHARS, Answer, Delivery
from shared.webhook_addresses import AddressRefused
from shared.webhooks import tenant_secret

MIN_MASKED_CHARS = 4  # a query value this long, quoted in a receiver's answer, is masked
# What a try that went wrong on the wire raises (all but a refused address: retried later).
WIRE_ERRORS = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
)


class Sender:
    """POSTs deliveries, each signed with its tenant's secret (derived from COSYQ_WEBHOOK_SECRET),
    over one connection pool (connection reuse)."""

    def __init__(
        self,
        secret: str,
        *,
        timeout_s: float,
        allow_private: bool,
        connections: int = 8,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`ssl_context`: the receivers' trusted roots (default: certifi's CA bundle)."""
        self.secret = secret
        self.signers: dict[str, Webhook] = {}  # tenant -> its signer
        self.timeout_s = timeout_s
        self.pool = httpcore.ConnectionPool(
            ssl_context=ssl_context or ssl.create_default_context(cafile=certifi.where()),
            max_connections=connections,  # one per delivery slot: a try never waits for one
            network_backend=CheckedBackend(allow_private=allow_private),
        )

    def close(self) -> None:
        self.pool.close()

    def signer(self, tenant: str) -> Webhook:
        """The signer of `tenant`'s events (made once per tenant)."""
        if tenant not in self.signers:
            self.signers[tenant] = Webhook(tenant_secret(self.secret, tenant))
        return self.signers[tenant]

    def headers(self, delivery: Delivery, at: datetime) -> dict[str, str]:
        event = delivery.event
        signature = self.signer(event.tenant).sign(event.webhook_id, at, delivery.body)
        return {
            "content-type": "application/json",
            "webhook-id": event.webhook_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signature,
            "user-agent": "cosyq-webhooks",
        }

    def send(self, delivery: Delivery) -> Answer:
        """One try, over within COSYQ_WEBHOOK_TIMEOUT_S whatever the receiver does."""
        at = datetime.fromtimestamp(int(time.time()), tz=UTC)
        timeouts = {name: self.timeout_s for name in ("connect", "read", "write", "pool")}
        try:
            with (
                deadline(self.timeout_s),
                self.pool.stream(
                    "POST",
                    delivery.event.url,
                    headers=list(self.headers(delivery, at).items()),
                    content=delivery.body.encode("utf-8"),
                    extensions={"timeout": timeouts},
                ) as response,
            ):
                status = response.status
                text = _start_of(response) if status >= 300 else ""
                text = _without_query(text, delivery.event.url)
        except AddressRefused as e:
            return Answer(False, str(e), permanent=True)
        except WIRE_ERRORS as e:
            return Answer(False, f"{type(e).__name__}: {e}")
        if 200 <= status < 300:
            return Answer(True)
        if 300 <= status < 400:
            return Answer(False, f"HTTP {status}: redirects are not followed")
        return Answer(False, f"HTTP {status}: {text}")


def _without_query(text: str, url: str) -> str:
    """A receiver's answer with the URL's query and its values shown as ***: one that quotes
    the URL it was posted to (`Cannot POST /hook?token=...`) would put a tenant's token in the
    log and the dead letters (values under MIN_MASKED_CHARS are no token)."""
    query = urlsplit(url).query
    raw = [item.partition("=")[2] for item in query.split("&")]
    decoded = [value for _, value in parse_qsl(query, keep_blank_values=True)]
    found = {part for part in (query, *raw, *decoded) if len(part) >= MIN_MASKED_CHARS}
    for part in sorted(found, key=len, reverse=True):  # the whole query before its values
        text = text.replace(part, "***")
    return text


def _start_of(response: httpcore.Response) -> str:
    """The first characters of a receiver's error answer (never more is read)."""
    taken = b""
    for chunk in response.iter_stream():
        taken += chunk
        if len(taken) >= ERROR_TEXT_CHARS * 4:
            break
    return taken.decode("utf-8", "replace")[:ERROR_TEXT_CHARS]
