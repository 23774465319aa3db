"""Fixtures for worker-process tests: a Cluster on the test's private Redis, cleaned up after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.doubles.harness import Cluster


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(redis_url=redis_url, root=tmp_path)
    yield cluster
    cluster.stop_all()


@pytest.fixture
def connection(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()
