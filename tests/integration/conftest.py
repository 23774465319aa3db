"""Integration fixtures: S3 endpoints over real HTTP (moto's server mode): the session's shared
one, one a test can stop and restart, one that checks credentials."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.doubles.s3_servers import AuthS3, RestartableS3, start_auth_s3


@dataclass(frozen=True)
class S3Endpoint:
    url: str
    region: str = "us-east-1"
    access_key_id: str = "testing"
    secret_access_key: str = "testing"  # moto accepts any credentials; boto3 needs some


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Endpoint]:
    """A moto S3 server on a free port of 127.0.0.1, for the whole session."""
    from moto.server import ThreadedMotoServer  # noqa: PLC0415 (dev-only dependency)

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield S3Endpoint(url=f"http://{host}:{port}")
    server.stop()


@pytest.fixture
def s3_endpoint(s3_server: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> S3Endpoint:
    """The server, with no real AWS configuration able to leak in."""
    for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    return s3_server


@pytest.fixture
def restartable_s3(s3_endpoint: S3Endpoint) -> Iterator[RestartableS3]:
    """A moto server of the test's own that the test may stop and start again (same port)."""
    server = RestartableS3()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def auth_s3(s3_endpoint: S3Endpoint, tmp_path: Path) -> Iterator[AuthS3]:
    """A moto server in its own process that checks credentials; bucket `checked` exists."""
    server = start_auth_s3(tmp_path / "moto-auth.log", buckets=("checked",))
    yield server
    server.stop()
