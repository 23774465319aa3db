"""One POST of one event: Standard Webhooks headers, no redirects, no private addresses.

Signed with the `standardwebhooks` library (`webhook-id`, `webhook-timestamp`,
`webhook-signature` = v1 HMAC-SHA256 of `id.timestamp.body`), so receivers verify with any
Standard Webhooks implementation. The body is frozen at the first try, so a redelivery sends the
same bytes under the same id.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
from standardwebhooks.webhooks import Webhook

from producer.webhooks.records import ERROR_TEXT_CHARS, Answer, Delivery


class Sender:
    """POSTs deliveries with one signing secret and one httpx client (connection reuse)."""

    def __init__(self, secret: str, *, timeout_s: float, allow_private: bool) -> None:
        self.signer = Webhook(secret)
        self.allow_private = allow_private
        self.client = httpx.Client(timeout=timeout_s, follow_redirects=False)

    def close(self) -> None:
        self.client.close()

    def headers(self, delivery: Delivery, at: datetime) -> dict[str, str]:
        event = delivery.event
        return {
            "content-type": "application/json",
            "webhook-id": event.webhook_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": self.signer.sign(event.webhook_id, at, delivery.body),
            "user-agent": "cosyq-webhooks",
        }

    def send(self, delivery: Delivery) -> Answer:
        refusal = None if self.allow_private else address_refusal(delivery.event.url)
        if refusal is not None:
            return refusal
        at = datetime.fromtimestamp(int(time.time()), tz=UTC)
        try:
            response = self.client.post(
                delivery.event.url,
                content=delivery.body.encode("utf-8"),
                headers=self.headers(delivery, at),
            )
        except httpx.HTTPError as e:
            return Answer(False, f"{type(e).__name__}: {e}")
        if 200 <= response.status_code < 300:
            return Answer(True)
        if 300 <= response.status_code < 400:
            return Answer(False, f"HTTP {response.status_code}: redirects are not followed")
        return Answer(False, f"HTTP {response.status_code}: {response.text[:ERROR_TEXT_CHARS]}")


def address_refusal(url: str) -> Answer | None:
    """Why `url` must not be called now: its host resolves to a loopback, private or link-local
    address (never deliverable), or does not resolve (tried again later). None: go ahead.

    Every address the name resolves to must be global: one private answer is enough to refuse.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        infos = socket.getaddrinfo(host, parts.port or 443, proto=socket.IPPROTO_TCP)
    except OSError as e:
        return Answer(False, f"cannot resolve {host}: {e}")
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            reason = (
                f"{host} resolves to {address}, not a public address "
                "(COSYQ_WEBHOOK_ALLOW_PRIVATE=1 allows it)"
            )
            return Answer(False, reason, permanent=True)
    return None
