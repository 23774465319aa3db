"""Deployment settings: one `Settings`, read from `COSYQ_*` variables and an optional `.env`.

Build it once per entry point with `load_settings()` and pass it down; there is no module-global
instance. A typo must not be silently ignored (pydantic-settings ignores unknown variables by
itself), so every `COSYQ_*` name in the environment or the `.env` file that is not a field is
rejected with the closest field suggested.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from shared import settings_errors
from shared.errors import SettingsError
from shared.settings_batch import BatchSettings
from shared.settings_bounds import BoundedNumbers
from shared.settings_connections import ConnectionSettings
from shared.settings_env import (
    ENV_PREFIX,
    read_env_files,
    redact_url,
    reject_unknown_variables,
)
from shared.settings_front import FrontSettings
from shared.settings_gpu import GpuSettings
from shared.settings_llm import LLMSettings
from shared.settings_memory import MemorySettings
from shared.settings_paths import FOLDER_FIELDS, check_folder
from shared.settings_quality import QualitySettings
from shared.settings_tenants import TenantSettings
from shared.tenants import DEFAULT_TENANT, ApiKey, parse_api_keys

DEFAULT_ENV_FILE = ".env"


def _default_coreml_cache_dir() -> Path:
    return Path.home() / ".cache" / "cosyq" / "coreml"


def _default_hash_cache_dir() -> Path:
    return Path.home() / ".cache" / "cosyq" / "hashes"


class Settings(
    settings_errors.MaskedRepr,
    ConnectionSettings,
    LLMSettings,
    FrontSettings,
    QualitySettings,
    TenantSettings,
    MemorySettings,
    BatchSettings,
    GpuSettings,
    BoundedNumbers,
    BaseSettings,
):
    """Every knob of a cosyq process; each limit is named here with its default.

    Producer side: max_*_chars/bytes, max_queue_depth, backpressure*, submit_chunk_size,
    job/result/failure TTLs, retries, idempotency_ttl_s, result polling; redis_*, storage_url
    and s3_* in settings_connections.py.
    Worker side: model_dir, backend, device, dtype, compute_units, coreml_*, engine, recycling
    limits (max_jobs*, max_rss_mb, max_lifetime_s), threads, pool_size, heartbeats; batch_* in
    settings_batch.py, malloc_* in settings_memory.py.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=DEFAULT_ENV_FILE,
        env_file_encoding="utf-8",
        extra="ignore",  # unknown COSYQ_ names are rejected by reject_unknown_variables
        validate_default=True,
    )

    # Model and backend (worker)
    model_dir: Path | None = Field(None, description="a CosyVoice2-0.5B or Fun-CosyVoice3-0.5B dir")
    backend: Literal["auto", "torch", "coreml"] = Field("auto", description="auto, torch or coreml")
    device: Literal["auto", "cpu", "mps", "cuda"] = Field(
        "auto", description="torch device: auto, cpu, mps or cuda"
    )
    dtype: Literal["fp32", "fp16", "bf16", "auto"] = Field(
        "fp32", description="weights: fp32/fp16/bf16, or auto (the host's measured best)"
    )
    compute_units: Literal["ALL", "CPU_AND_NE", "CPU_AND_GPU", "CPU_ONLY"] = Field(
        "ALL", description="Core ML compute units"
    )
    coreml_dir: Path | None = Field(
        None, description="converted Core ML packages (unset: <model_dir>/coreml)"
    )
    coreml_cache_dir: Path = Field(
        default_factory=_default_coreml_cache_dir, description="compiled .mlmodelc cache"
    )
    coreml_compile_timeout_s: float = Field(
        900.0,
        gt=0,
        description="longest wait for another worker's Core ML compile (an ANE compile: ~2 min)",
    )
    engine: str = Field(
        "workers.service.default_engine:engine_from_settings",
        description="dotted factory(settings) -> engine (operator config; tests use doubles)",
    )
    hash_cache_dir: Path = Field(
        default_factory=_default_hash_cache_dir,
        description="checkpoint SHA-256 cache (a recycled worker does not rehash 2.5 GB)",
    )
    normalize_text: bool = Field(True, description="text normalisation (wetext) before tokens")
    max_piece_tokens: int = Field(
        80,
        gt=0,
        description="long text is split at sentences into pieces of at most this many"
        " text tokens, synthesized one by one",
    )
    piece_gap_ms: int = Field(100, ge=0, description="silence between the pieces' audio")
    allow_rosetta: bool = Field(False, description="let a worker run under Rosetta 2 (slow)")

    # Request limits (checked by producer and worker alike)
    max_text_chars: int = Field(2000, gt=0, description="longest text (and prompt text)")
    max_metadata_bytes: int = Field(4096, ge=0, description="largest request metadata, as JSON")
    max_metadata_depth: int = Field(
        32, gt=0, description="deepest nesting of request metadata (the object itself is 1)"
    )
    max_output_key_chars: int = Field(
        512, gt=0, description="longest output_key (S3 allows 1,024 bytes with the prefix)"
    )
    max_speech_seconds: float = Field(
        150.0,
        gt=0,
        description="most speech one request may ask for, estimated from its text tokens"
        " before synthesis (150 s: ~560 s at the slowest measured CPU RTF, 3.73, within the"
        " default 600 s job timeout)",
    )
    max_break_seconds: float = Field(10.0, ge=0, description="longest SSML <break> pause")
    max_breaks: int = Field(50, ge=0, description="most SSML <break>s between words in a text")
    max_prompt_seconds: float = Field(
        30.0, gt=0, description="longest prompt audio (the speech tokenizer's limit)"
    )
    default_voice_cache_ttl_s: int = Field(
        604800,
        ge=0,
        description="how long workers share the default voice's features in Redis (0: never)",
    )
    voice_upload_grace_s: float = Field(
        3600.0,
        gt=0,
        description="a voice recording uploaded this long ago whose add-voice job never came "
        "(its front was killed mid upload) or failed for good, and that no voice names, is "
        "deleted by a worker's housekeeping",
    )

    # Queueing
    max_queue_depth: int = Field(
        10000, gt=0, description="jobs a queue may hold before submit pushes back"
    )
    backpressure: Literal["raise", "block"] = Field(
        "raise", description="on a full queue: raise QueueFullError, or block until room"
    )
    backpressure_timeout_s: float = Field(
        60.0, ge=0, description="longest block for room before QueueFullError"
    )
    backpressure_poll_s: float = Field(0.25, gt=0, description="queue-depth poll while blocked")
    submit_chunk_size: int = Field(500, gt=0, description="jobs per pipelined round trip")
    idempotency_ttl_s: int = Field(
        86400, gt=0, description="how long an idempotency key maps to its first job"
    )
    idempotency_claim_grace_s: float = Field(
        60.0,
        ge=0,
        description="how long a key claimed before its job by an older release's submit (in "
        "flight) counts as taken; keys are now claimed with their job, and one whose job is "
        "gone (rq empty, deleted, expired) is free at once",
    )
    job_timeout_s: int = Field(
        600,
        gt=0,
        description="longest one attempt of a job may run; a job past it fails transient and is "
        "retried (COSYQ_MAX_RETRIES) on a recycled worker: up to (1 + COSYQ_MAX_RETRIES) times "
        "this in all",
    )
    result_ttl_s: int = Field(86400, gt=0, description="how long results are kept")
    failure_ttl_s: int = Field(604800, gt=0, description="how long failed jobs are kept")
    audio_retention: Literal["unnamed", "with_result", "keep"] = Field(
        "unnamed",
        description="a job's stored audio (and a document's file, manifest and captions) once its "
        "result expires: unnamed deletes what is at keys cosyq chose and keeps a caller's "
        "output_key; with_result deletes both; keep keeps all",
    )
    cancel_check_ms: float = Field(
        100.0, ge=0, description="a running job reads its cancel flag at most this often (ms)"
    )
    cancel_lost_answer_wait_s: float = Field(
        10.0,
        gt=0,
        description="a cancel whose transaction's answer was lost with Redis waits this long "
        "for Redis to read back what it did (then: try again)",
    )
    max_retries: int = Field(2, ge=0, description="retries of a transient failure")
    retry_backoff_s: float = Field(
        5.0, ge=0, description="retry k waits retry_backoff_s * 2**(k-1) seconds"
    )
    result_poll_interval_s: float = Field(
        0.5, gt=0, description="longest pause between status polls while waiting"
    )
    wait_timeout_s: float = Field(
        3600.0, gt=0, description="default wait for results (result(), cosyq --wait, say)"
    )
    stream_maxlen: int = Field(
        2000,
        gt=0,
        description="most entries a job's audio stream keeps (XADD MAXLEN); chunks are 1-4 s",
    )
    stream_timeout_s: float = Field(
        120.0, gt=0, description="default wait for a streamed job's chunks (stream(), --stream)"
    )
    stream_first_hop_tokens: int = Field(
        25, gt=0, description="speech tokens in a stream's first chunk (upstream: 25 = 1 s)"
    )
    stream_max_hop_tokens: int = Field(
        100,
        gt=0,
        description="most speech tokens per later chunk (hops double up to it; at least the first)",
    )
    stream_flow_cache_max_mb: float = Field(
        2048.0,
        gt=0,
        description="flow cache per streamed piece (full model: ~4.6 MB per mel frame, 0.23 GB "
        "per second of prompt + speech); never passed: the chunk that would need more and the "
        "piece's later ones recompute the prefix",
    )
    stream_voice_cache_max_mb: float = Field(
        1024.0,
        ge=0,
        description="primed flow prompt prefixes kept per worker process, least recently used "
        "voice first out (full model in fp32: ~0.23 GB per prompt second); a voice's later "
        "streamed pieces skip its prompt's frames in their first chunk; 0 turns it off",
    )
    stream_align_prompt: bool = Field(
        False,
        description="streamed pieces condition the flow on the prompt less its first P mod 25 "
        "speech tokens, so the first chunk needs no pad tokens and no prompt frames of its own "
        "(earlier; the voice's audio from a slightly shorter prompt)",
    )
    stream_block_ms: int = Field(
        1000, gt=0, description="longest one blocking XREAD waits before the job is re-checked"
    )

    # Worker processes
    max_jobs: int = Field(200, gt=0, description="jobs a worker takes before it recycles")
    max_jobs_jitter: int | None = Field(
        None, ge=0, description="random extra jobs per worker (unset: 10% of max_jobs)"
    )
    max_rss_mb: int = Field(8192, gt=0, description="recycle a worker above this RSS")
    max_lifetime_s: int = Field(21600, gt=0, description="recycle a worker after this long")
    threads: int | None = Field(
        None, gt=0, description="intra-op threads per worker (unset: cores // pool_size)"
    )
    pool_size: int = Field(1, gt=0, description="worker processes of `cosyq-worker pool`")
    pool_start: Literal["exec", "template"] = Field(
        "exec",
        description="exec (a fresh interpreter per worker) or template (Linux: forked from one "
        "process that imported the worker's modules; macOS execs: fork is unsafe after Core ML)",
    )
    orphan_after_s: float = Field(
        30.0, gt=0, description="a job in no queue or registry this long is requeued or reaped"
    )
    orphan_sweep_batch: int = Field(
        500, gt=0, description="submitted jobs the orphan sweep checks per housekeeping tick"
    )
    dequeue_poll_s: float = Field(
        1.0, gt=0, le=60, description="longest blocking pop before a worker looks for a stop"
    )
    heartbeat_interval_s: float = Field(2.0, gt=0, description="per-job heartbeat period")
    heartbeat_ttl_s: float = Field(
        10.0, gt=0, description="a job whose heartbeat is this old has lost its worker"
    )
    stop_redis_wait_s: float = Field(
        30.0,
        gt=0,
        description="once a warm stop is asked, how long a worker still waits for an "
        "unreachable Redis to record or give back its job before it exits (status 3)",
    )

    # Long-form documents (producer splits, workers synthesize the segments and assemble)
    max_document_chars: int = Field(
        1_000_000, gt=0, description="longest document text (characters, markup included)"
    )
    max_document_segments: int = Field(
        5000, gt=0, description="most segments (jobs) one document may split into"
    )
    document_segment_chars: int = Field(
        1000,
        ge=50,
        description="longest segment a document is split into (capped by COSYQ_MAX_TEXT_CHARS)",
    )
    document_segment_speech_s: float = Field(
        90.0,
        gt=0,
        description="most speech a segment is estimated at (Chinese, Japanese and Korean "
        "characters as the worker counts them, a high estimate from the other characters, "
        "digits as the words they become, and pauses); a segment the worker's own count puts "
        "over COSYQ_MAX_SPEECH_SECONDS is spoken piece by piece, never refused",
    )
    document_sentence_pause_ms: int = Field(
        100, ge=0, le=10000, description="silence between segments split inside a paragraph"
    )
    document_paragraph_pause_ms: int = Field(
        600, ge=0, le=10000, description="silence at a paragraph boundary"
    )
    document_heading_pause_ms: int = Field(
        900, ge=0, le=10000, description="silence before and after a Markdown heading"
    )
    document_keep_segments: bool = Field(
        False,
        description="keep each segment's audio after the document is assembled (until the "
        "document expires, as COSYQ_AUDIO_RETENTION says)",
    )
    document_claim_ttl_s: float = Field(
        30.0, gt=0, description="an assembler whose heartbeat is this old has died"
    )
    document_assembly_grace_s: float = Field(
        10.0,
        gt=0,
        description="a document whose last segment was recorded this long ago and whose "
        "assembly job does not exist (its worker died in between) gets the job from any worker",
    )

    # Metrics (worker side: the pool, or a lone `cosyq-worker run`)
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="serve Prometheus /metrics on this port (unset: off)"
    )
    metrics_host: str = Field("127.0.0.1", description="address /metrics binds to")

    # Logging
    log_level: str = Field(
        "INFO", description="DEBUG, INFO, WARNING, ERROR (S3 client's and RQ's: INFO at most)"
    )
    log_format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto: JSON lines unless on a terminal"
    )

    def __init__(self, **values: Any) -> None:
        env_file = values.get("_env_file", DEFAULT_ENV_FILE)
        reject_unknown_variables(
            os.environ,
            read_env_files(env_file),
            known={ENV_PREFIX + n.upper() for n in Settings.model_fields},
        )
        super().__init__(**values)

    @field_validator(*FOLDER_FIELDS, mode="before")
    @classmethod
    def _check_folder(cls, value: Any, info: ValidationInfo) -> Any:
        return check_folder(info.field_name or "", value)

    @field_validator("api_keys")
    @classmethod
    def _check_api_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            try:
                parse_api_keys(value.get_secret_value())
            except SettingsError as e:
                raise ValueError(str(e)) from e
        return value

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        name = value.upper()
        if not isinstance(logging.getLevelName(name), int):
            raise ValueError("must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return name

    @model_validator(mode="after")
    def _check_heartbeat(self) -> Settings:
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise ValueError("heartbeat_ttl_s must be longer than heartbeat_interval_s")
        if self.redis_wait_replicas and self.redis_wait_timeout_s >= self.heartbeat_ttl_s / 2:
            raise ValueError(
                "redis_wait_timeout_s must be shorter than heartbeat_ttl_s / 2 (the read "
                "timeout of the worker's housekeeping client, which sends the WAIT)"
            )
        return self

    @model_validator(mode="after")
    def _check_webhooks(self) -> Settings:
        if self.webhook_claim_idle_s <= self.webhook_timeout_s:
            raise ValueError(
                "webhook_claim_idle_s must be longer than webhook_timeout_s (else a delivery "
                "still under way is taken over by another dispatcher and sent twice)"
            )
        return self

    def api_key_entries(self) -> tuple[ApiKey, ...]:
        """The HTTP front's accepted bearer keys with their tenants (COSYQ_API_KEYS)."""
        raw = self.api_keys.get_secret_value() if self.api_keys is not None else ""
        return parse_api_keys(raw)

    def api_key_list(self) -> tuple[str, ...]:
        """The HTTP front's accepted bearer keys alone."""
        return tuple(key.secret for key in self.api_key_entries())

    def tenant_names(self) -> tuple[str, ...]:
        """Every tenant this deployment knows: "default", COSYQ_API_KEYS's, COSYQ_TENANTS."""
        named = {key.tenant for key in self.api_key_entries()}
        named |= {part.strip() for part in (self.tenants or "").split(",") if part.strip()}
        return (DEFAULT_TENANT, *sorted(named - {DEFAULT_TENANT}))

    def redacted_redis_url(self) -> str:
        """The Redis URL with any password replaced by ***, for logs and `cosyq status`."""
        return redact_url(self.redis_url)


def load_settings(env_file: str | Path | None = DEFAULT_ENV_FILE, **overrides: Any) -> Settings:
    """Build Settings for an entry point; bad values become one SettingsError naming each field
    (with no secret in it: shared/settings_errors.py)."""
    try:
        return Settings(_env_file=env_file, **overrides)
    except ValidationError as e:
        # from None: the ValidationError's own text holds every setting's value (its input)
        raise SettingsError(settings_errors.describe(e, Settings.model_fields)) from None
    except UnicodeDecodeError as e:
        raise SettingsError(f"the settings file {env_file} is not UTF-8 text ({e.reason})") from e
    except PydanticSettingsError as e:  # a JSON setting that does not parse
        raise SettingsError(settings_errors.describe_unparsed(e)) from e
