"""Where a cosyq process finds Redis and storage (`COSYQ_REDIS_*`, `COSYQ_STORAGE_*`,
`COSYQ_S3_*`, `COSYQ_PROMPT_ROOTS`), a block of `Settings` fields with their checks, kept apart
so settings.py stays small; `Settings` inherits them and reads them like its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, FilePath, SecretStr, field_validator

from shared.prompt_uris import prompt_root
from shared.settings_env import check_redis_url

STORAGE_SCHEMES = ("file", "s3")


def _default_storage_url() -> str:
    return (Path.cwd() / "cosyq-output").resolve().as_uri()


class ConnectionSettings(BaseModel):
    """Redis (standalone, TLS, unix socket or Sentinel) and the audio storage (disk or S3)."""

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        repr=False,  # may hold a password
        description="Redis URL: redis://, rediss:// (TLS), unix:// or redis+sentinel://"
        "host:port[,host:port]/service[/db]; user:password@ for ACLs",
    )
    redis_connect_timeout_s: float = Field(5.0, gt=0, description="Redis connect timeout, TLS too")
    redis_socket_timeout_s: float | None = Field(
        None, gt=0, description="Redis read timeout (unset: as long as a blocking call asks)"
    )
    redis_silent_close_s: float = Field(
        15.0,
        ge=0,
        description="until a process has had a reply from Redis, a server that closes each "
        "connection unanswered this long (3 tries) is refused as no Redis, exit 2: another "
        "service's port, a TLS-only Redis (0: waited out as an outage)",
    )
    redis_health_check_interval_s: int = Field(
        30, ge=0, description="PING an idle Redis connection before reuse after this long"
    )
    redis_wait_replicas: int = Field(
        0,
        ge=0,
        description="a worker starts a job only once its attempt is on this many replicas"
        " (Sentinel: 1 makes attempt counts exact across a failover)",
    )
    redis_wait_timeout_s: float = Field(
        1.0, gt=0, description="longest wait for those replicas before the job is put back"
    )
    redis_ssl_ca_certs: FilePath | None = Field(  # must exist: else "cannot reach Redis" forever
        None, description="CA bundle for rediss:// servers with a private CA"
    )
    storage_url: str = Field(
        default_factory=_default_storage_url,
        description="where audio is written: file:///path or s3://bucket/prefix",
    )
    s3_endpoint_url: str | None = Field(None, description="S3 endpoint (MinIO, R2); unset: AWS")
    s3_region: str | None = Field(None, description="S3 region; unset: the AWS environment's")
    s3_access_key_id: str | None = Field(
        None,
        description="S3 key id; unset: the usual AWS variables, profile or role",
        json_schema_extra={"secret": True},  # never shown in a settings error
    )
    s3_secret_access_key: SecretStr | None = Field(None, description="S3 secret key")
    s3_addressing_style: Literal["auto", "path", "virtual"] = Field(
        "auto", description="S3 addressing: auto, path (most MinIO setups) or virtual"
    )
    max_read_bytes: int = Field(
        64 * 1024 * 1024, gt=0, description="largest object read from storage (prompt audio)"
    )
    s3_max_attempts: int = Field(
        3, gt=0, description="tries of one S3 call inside botocore (its standard retry mode)"
    )
    s3_connect_timeout_s: float = Field(5.0, gt=0, description="S3 connect timeout")
    s3_read_timeout_s: float = Field(30.0, gt=0, description="S3 read timeout")
    storage_probe_wait_s: float = Field(
        60.0,
        ge=0,
        description="how long worker start-up retries a transient storage failure before exiting",
    )
    storage_write_attempts: int = Field(
        4, gt=0, description="writes of one job's audio (transient failures) before the try fails"
    )
    storage_retry_backoff_s: float = Field(
        0.5, ge=0, description="first pause between storage retries (doubles each time)"
    )
    storage_retry_backoff_max_s: float = Field(
        8.0, ge=0, description="longest pause between storage retries"
    )
    start_failure_ttl_s: int = Field(
        3600, gt=0, description="how long `cosyq status` shows a worker's start-up failure"
    )
    prompt_roots: str | None = Field(
        None,
        description="comma-separated file:///folders and s3://bucket/prefixes a worker reads "
        "prompt_audio from (unset: the model dir and the storage URL)",
    )

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str) -> str:
        return check_redis_url(value)

    @field_validator("storage_url")
    @classmethod
    def _check_storage_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in STORAGE_SCHEMES:
            raise ValueError("must start with file:// or s3://")
        if parts.scheme == "file" and (parts.netloc not in ("", "localhost") or not parts.path):
            raise ValueError("a file URL needs an absolute path: file:///srv/cosyq-output")
        if parts.scheme == "s3" and not parts.netloc:
            raise ValueError("an s3 URL needs a bucket: s3://bucket/prefix")
        if "@" in parts.netloc:  # it would name every result: COSYQ_S3_* hold the keys
            raise ValueError("an s3 URL takes no credentials: set COSYQ_S3_ACCESS_KEY_ID")
        return value

    @field_validator("s3_endpoint_url")
    @classmethod
    def _check_s3_endpoint_url(cls, value: str | None) -> str | None:
        """botocore refuses an endpoint without its scheme only when the worker first writes
        ("Invalid endpoint: minio:9000"), and the front when it first reads."""
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must start with http:// or https://: http://minio:9000")
        return value

    @field_validator("prompt_roots")
    @classmethod
    def _check_prompt_roots(cls, value: str | None) -> str | None:
        if value is not None:
            for part in value.split(","):
                if part.strip():
                    prompt_root(part.strip())
        return value
