"""The HTTP front on a Sentinel URL, and its GET /metrics (the fleet as Redis sees it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from producer import CosyqClient
from shared import keys
from shared.connection import redis_connection
from shared.settings import load_settings
from tests.doubles.sentinel import SentinelSet
from tests.integration.producer.http.conftest import start_front


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSet]:
    trio = SentinelSet(tmp_path / "redis")
    trio.start()
    yield trio
    trio.stop()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_front_on_sentinel_serves_queue_depths_and_workers(
    sentinels: SentinelSet, tmp_path: Path
) -> None:
    settings = load_settings(env_file=None, redis_url=sentinels.url)
    with CosyqClient(settings) as client:
        client.submit_many([{"text": "waiting", "priority": "low"}] * 2)
    connection = redis_connection(settings)
    stats = keys.WORKER_STATS_PREFIX
    connection.hset(stats + "host.1.aa", mapping={"state": "idle", "rss_mb": "100"})
    connection.hset(stats + "host.2.bb", mapping={"state": "busy", "rss_mb": "250"})
    connection.hset(stats + "host.3.cc", mapping={"state": "loading", "rss_mb": "80"})
    front = start_front(tmp_path / "front", sentinels.url)
    try:
        response = httpx.get(front.url + "/metrics", timeout=10)  # no key: like /healthz
        assert response.status_code == 200
        got = samples(response.text)
    finally:
        front.stop()
        connection.close()
    assert got[("cosyq_queue_depth", (("queue", "cosyq-low"),))] == 2
    assert got[("cosyq_queue_depth", (("queue", "cosyq-high"),))] == 0
    assert got[("cosyq_workers", (("state", "idle"),))] == 1
    assert got[("cosyq_workers", (("state", "busy"),))] == 1
    assert got[("cosyq_workers", (("state", "loading"),))] == 1
    assert got[("cosyq_workers", (("state", "retiring"),))] == 0
    assert got[("cosyq_worker_rss_bytes", (("worker", "host.2.bb"),))] == 250 * 2**20
