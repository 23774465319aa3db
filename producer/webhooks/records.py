"""What the webhook books hold: a delivery (an event, its frozen body, its tries so far) and how
one try went. No HTTP client here, so `cosyq status` can count deliveries on a base install."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from shared.webhooks import WebhookEvent

ERROR_TEXT_CHARS = 300  # of a receiver's answer kept with a failed try


@dataclass(frozen=True)
class Delivery:
    """An event with its frozen body and what its tries so far came to."""

    event: WebhookEvent
    body: str
    tries: int = 0
    first_try_at: float = 0.0  # epoch seconds of the first try
    last_error: str = ""

    def to_json(self) -> str:
        return json.dumps(
            {**asdict(self), "event": self.event.fields()}, ensure_ascii=False, sort_keys=True
        )

    @classmethod
    def from_json(cls, text: str) -> Delivery:
        doc = json.loads(text)
        return cls(
            event=WebhookEvent.from_fields(doc["event"]),
            body=str(doc["body"]),
            tries=int(doc["tries"]),
            first_try_at=float(doc["first_try_at"]),
            last_error=str(doc.get("last_error", "")),
        )

    def failed(self, error: str) -> Delivery:
        return replace(self, tries=self.tries + 1, last_error=error[:ERROR_TEXT_CHARS])


@dataclass(frozen=True)
class Answer:
    """How a try went: delivered, worth another try later, or never deliverable."""

    delivered: bool
    error: str = ""
    permanent: bool = False
