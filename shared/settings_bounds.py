"""The largest (and, where a field has none, the smallest) value of every numeric setting.

Why: a number past any use is a typo or a unit mistake (`COSYQ_REDIS_CONNECT_TIMEOUT_S=1e300`,
`inf`, a size in bytes given to a setting in MB), and left alone it reached C code and time
arithmetic much later as an OverflowError traceback (socket timeouts, `threading` waits,
`datetime + timedelta`, glibc's `mallopt` taking an `int`), or a wait that never ends. So each
is refused at load, one line naming the variable and its bound, as a field's own `le=` is.

A field with a `le`/`lt` of its own (COSYQ_BATCH_SIZE) keeps it; every other numeric field has
its ceiling here, chosen per setting: far above any deployment's need, below what breaks.
tests/unit/shared/test_settings_bounds.py fails for a numeric field with none, so a new one
gets a decision too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

MINUTE = 60
HOUR = 60 * MINUTE
DAY = 24 * HOUR
YEAR = 366 * DAY
MB_PER_TB = 1024 * 1024

# Connect timeouts: past a few minutes TCP itself has given up (its SYN retries, ~2 min).
CONNECT_TIMEOUT_S = 10 * MINUTE
# Read timeouts, polls, backoffs and waits of one call or one loop.
WAIT_S = DAY
# Retention in Redis (results, failures, keys, sessions, voices): a year is past any purpose.
RETENTION_S = YEAR
# Counts handed to Redis, HTTP, threads or the model: far past any deployment's.
COUNT = 10**9

CEILINGS: dict[str, float] = {
    # Redis and storage
    "redis_connect_timeout_s": CONNECT_TIMEOUT_S,
    "redis_socket_timeout_s": WAIT_S,
    "redis_silent_close_s": CONNECT_TIMEOUT_S,
    "redis_health_check_interval_s": DAY,
    "redis_wait_replicas": 1000,
    "redis_wait_timeout_s": HOUR,
    "max_read_bytes": 4 * 2**30,
    "s3_max_attempts": 100,
    "s3_connect_timeout_s": CONNECT_TIMEOUT_S,
    "s3_read_timeout_s": HOUR,
    "storage_probe_wait_s": WAIT_S,
    "storage_write_attempts": 100,
    "storage_retry_backoff_s": HOUR,
    "storage_retry_backoff_max_s": HOUR,
    "start_failure_ttl_s": RETENTION_S,
    # Model, text and requests
    "coreml_compile_timeout_s": WAIT_S,
    "max_piece_tokens": 100_000,
    "piece_gap_ms": 10_000,  # as a document's pauses: each gap is audio held in memory
    "max_text_chars": 10**8,
    "max_metadata_bytes": 2**30,
    "max_metadata_depth": 200,  # deeper than Python's recursion limit lets json nest safely
    "max_output_key_chars": 1024,  # S3's own limit on a key
    "max_speech_seconds": DAY,
    "max_break_seconds": 10 * MINUTE,  # silence held in memory, per break
    "max_breaks": 10**6,
    "max_prompt_seconds": HOUR,  # the speech tokenizer takes 30 s of it at most anyway
    "default_voice_cache_ttl_s": RETENTION_S,
    "voice_upload_grace_s": WAIT_S,
    # Queueing and results
    "max_queue_depth": COUNT,
    "backpressure_timeout_s": WAIT_S,
    "backpressure_poll_s": HOUR,
    "submit_chunk_size": 10**6,
    "idempotency_ttl_s": RETENTION_S,
    "idempotency_claim_grace_s": WAIT_S,
    "job_timeout_s": 7 * DAY,
    "result_ttl_s": RETENTION_S,
    "failure_ttl_s": RETENTION_S,
    "cancel_check_ms": HOUR * 1000,
    "cancel_lost_answer_wait_s": WAIT_S,
    "max_retries": 20,  # retry k waits COSYQ_RETRY_BACKOFF_S * 2**(k-1): 20 at 1 h is 60 years
    "retry_backoff_s": HOUR,
    "result_poll_interval_s": HOUR,
    "wait_timeout_s": 7 * DAY,
    "stream_maxlen": COUNT,
    "stream_timeout_s": 7 * DAY,
    "stream_first_hop_tokens": 100_000,
    "stream_max_hop_tokens": 100_000,
    "stream_flow_cache_max_mb": MB_PER_TB,
    "stream_voice_cache_max_mb": MB_PER_TB,
    "stream_block_ms": HOUR * 1000,
    # Worker processes
    "max_jobs": COUNT,
    "max_jobs_jitter": COUNT,
    "max_rss_mb": 64 * MB_PER_TB,
    "max_lifetime_s": RETENTION_S,
    "threads": 4096,
    "pool_size": 4096,
    "orphan_after_s": WAIT_S,
    "orphan_sweep_batch": 10**6,
    "heartbeat_interval_s": HOUR,
    "heartbeat_ttl_s": WAIT_S,
    "stop_redis_wait_s": WAIT_S,
    "malloc_trim_threshold_mb": 2047,  # glibc's mallopt takes the bytes as a C int
    # Documents
    "max_document_chars": 10**9,
    "max_document_segments": 10**7,
    "document_segment_chars": 10**8,
    "document_segment_speech_s": DAY,
    "document_claim_ttl_s": WAIT_S,
    "document_assembly_grace_s": WAIT_S,
    # Quality check
    "quality_min_length_ratio": 1000,
    "quality_max_length_ratio": 1000,
    "quality_min_expected_s": DAY,
    "quality_max_silence_s": DAY,
    "quality_max_edge_silence_s": DAY,
    "quality_trim_margin_ms": HOUR * 1000,
    # HTTP front, operator's page, webhooks, tenants
    "http_wait_timeout_s": WAIT_S,
    "http_max_waits": 10**6,
    "http_max_body_bytes": 2**30,
    "http_max_upload_bytes": 2**30,
    "http_max_json_values": 10**8,
    "http_request_read_timeout_s": WAIT_S,
    "http_max_batch": 10**6,
    "http_retry_after_s": DAY,
    "http_auth_failures_per_minute": COUNT,
    "ui_session_ttl_s": RETENTION_S,
    "ui_max_form_bytes": 2**30,
    "ui_scan_limit": COUNT,
    "webhook_timeout_s": HOUR,
    "webhook_retry_hours": 24 * 366,
    "webhook_backoff_s": WAIT_S,
    "webhook_backoff_max_s": WAIT_S,
    "webhook_concurrency": 10_000,
    "webhook_receiver_concurrency": 10_000,
    "webhook_event_memory_hours": 24 * 366,
    "webhook_claim_idle_s": WAIT_S,
    "webhook_poll_s": HOUR,
    "tenant_max_queued_jobs": COUNT,
    "tenant_requests_per_minute": COUNT,
    "tenant_max_voices": COUNT,
    "tenant_max_waits": 10**6,
}

# The numeric fields with no lower bound of their own (each other has a gt/ge).
FLOORS: dict[str, float] = {
    "quality_silence_dbfs": -200.0,  # 16-bit audio's floor is -96 dBFS; -inf is no threshold
}


def spelled(name: str, bound: float) -> str:
    """`3600` as "1 hour" for a setting in seconds (ms, hours likewise); "" for any other."""
    seconds = {"_s": bound, "_ms": bound / 1000, "_hours": bound * HOUR}
    unit = next((suffix for suffix in seconds if name.endswith(suffix)), None)
    if unit is None:
        return ""
    value = seconds[unit]
    for size, word in ((DAY, "day"), (HOUR, "hour"), (MINUTE, "minute"), (1, "second")):
        if value >= size and value % size == 0:
            count = int(value // size)
            return f" ({count} {word}{'' if count == 1 else 's'})"
    return ""


class BoundedNumbers(BaseModel):
    """A mixin: every field named in CEILINGS (FLOORS) refused past its bound, as `le=` would."""

    @field_validator("*", mode="after")
    @classmethod
    def _check_bounds(cls, value: Any, info: ValidationInfo) -> Any:
        name = info.field_name or ""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return value
        ceiling = CEILINGS.get(name)
        if ceiling is not None and not value <= ceiling:  # nan and inf too
            raise PydanticCustomError(
                "less_than_equal",
                "Input should be less than or equal to {le}{spelled}",
                {"le": _number(ceiling), "spelled": spelled(name, ceiling)},
            )
        floor = FLOORS.get(name)
        if floor is not None and not value >= floor:
            raise PydanticCustomError(
                "greater_than_equal",
                "Input should be greater than or equal to {ge}",
                {"ge": _number(floor)},
            )
        return value


def _number(bound: float) -> int | float:
    return int(bound) if float(bound).is_integer() else bound
