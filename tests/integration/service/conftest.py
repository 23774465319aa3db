"""Fixtures for worker-process tests: a Cluster on the test's private Redis, cleaned up after."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from shared.settings import Settings
from tests.doubles.harness import Cluster
from tests.integration.conftest import S3Endpoint
from tests.integration.shared.test_storage import file_settings, make_bucket, s3_settings
from workers.service.template import EXEC, TEMPLATE
from workers.tools.local_redis import LocalRedis


@pytest.fixture(params=[1, 8], ids=["batch1", "batch8"])
def worker_batch_size(request: pytest.FixtureRequest) -> int:
    """Every worker test runs one job at a time and with COSYQ_BATCH_SIZE=8 (issue 10)."""
    return int(request.param)


@pytest.fixture
def cluster(
    redis_url: str, tmp_path: Path, worker_batch_size: int, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    """`run` workers forked from the test template, or started with exec where the test is
    marked `worker_exec` (its subject is the start: tests/doubles/harness.py)."""
    overrides = {"COSYQ_BATCH_SIZE": str(worker_batch_size)}
    mode = EXEC if request.node.get_closest_marker("worker_exec") else TEMPLATE
    cluster = Cluster(redis_url=redis_url, root=tmp_path, overrides=overrides, start_mode=mode)
    yield cluster
    cluster.stop_all()


@pytest.fixture
def connection(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def persistent_redis(tmp_path: Path) -> Iterator[LocalRedis]:
    """A private redis-server that keeps its data across a restart (outage tests stop it)."""
    server = LocalRedis(tmp_path / "redis", persistent=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=["file", "s3"])
def storage_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Settings]:
    """Settings (extra fields as keywords) on a folder, and on a bucket of moto's S3 server."""
    if request.param == "file":
        return lambda **extra: file_settings(tmp_path / "out", **extra)
    endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"stored-{tmp_path.name.lower().replace('_', '-')[-40:]}"
    make_bucket(endpoint, bucket)
    return lambda **extra: s3_settings(endpoint, f"s3://{bucket}/tts", **extra)
