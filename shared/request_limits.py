"""The size limits a job is checked against: the same on both sides (producer and worker)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.settings import Settings
from shared.webhooks import allowed_prefixes


@dataclass(frozen=True)
class RequestLimits:
    """The size limits a request is checked against (from Settings, the same on both sides)."""

    max_text_chars: int = 2000
    max_metadata_bytes: int = 4096
    max_metadata_depth: int = 32
    max_output_key_chars: int = 512
    max_speech_seconds: float = 150.0
    max_break_seconds: float = 10.0
    max_breaks: int = 50
    webhook_allowed_urls: tuple[str, ...] = ()  # URL prefixes a webhook may name
    webhook_allow_private: bool = False  # a webhook may name a loopback/private address
    webhook_resolve_names: bool = False  # resolve a webhook's host name (the producer only)

    @classmethod
    def from_settings(cls, settings: Settings, *, resolve_names: bool = False) -> RequestLimits:
        """The limits from settings; `resolve_names`: a webhook's host name is resolved and
        refused when it names a private address (the producer; workers never call DNS here)."""
        return cls(
            max_text_chars=settings.max_text_chars,
            max_metadata_bytes=settings.max_metadata_bytes,
            max_metadata_depth=settings.max_metadata_depth,
            max_output_key_chars=settings.max_output_key_chars,
            max_speech_seconds=settings.max_speech_seconds,
            max_break_seconds=settings.max_break_seconds,
            max_breaks=settings.max_breaks,
            webhook_allowed_urls=allowed_prefixes(settings.webhook_allowed_urls),
            webhook_allow_private=settings.webhook_allow_private,
            webhook_resolve_names=resolve_names,
        )
