"""The HTTP front on a Sentinel URL, and its GET /metrics (the fleet as Redis sees it): every
queue to an operator key (or on a front without keys), a tenant key its own tenant's only, no
key the fleet without queue depths (unless COSYQ_METRICS_PUBLIC_QUEUE_DEPTH)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from producer import CosyqClient
from shared import keys
from shared.connection import redis_connection
from shared.settings import load_settings
from tests.conftest import RedisServer
from tests.doubles.sentinel import SentinelSet
from tests.integration.producer.http.conftest import Front, fresh_db, start_front


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


ALPHA, BETA = "alpha-key-" + "1" * 20, "beta-key-" + "2" * 20
OPERATOR = "operator-key-" + "4" * 20
KEYS = {"COSYQ_API_KEYS": f"alpha:{ALPHA},beta:{BETA}", "COSYQ_OPERATOR_KEYS": OPERATOR}
HIGH, DEFAULT, LOW = keys.QUEUES_IN_PRIORITY_ORDER


def depths(front: Front, key: str | None) -> dict[str, float]:
    """queue -> cosyq_queue_depth of one scrape with `key`, the fleet gauges checked first."""
    with front.http(key) as client:
        page = client.get("/metrics")
    assert page.status_code == 200, page.text
    got = samples(page.text)
    assert got[("cosyq_workers", (("state", "idle"),))] == 1, key
    assert got[("cosyq_worker_rss_bytes", (("worker", "host.1.aa"),))] == 100 * 2**20, key
    if key != OPERATOR:
        assert "alpha" not in page.text and "beta" not in page.text, key
        assert "cosyq_tenant_queued_jobs" not in page.text, key
    queued = [(labels, v) for (name, labels), v in got.items() if name == "cosyq_queue_depth"]
    return {dict(labels)["queue"]: v for labels, v in queued}


def test_a_tenant_or_keyless_scrape_never_reveals_another_tenants_depth(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """alpha has 3 low and 2 high jobs waiting, beta 1 low: beta's scrape shows its 1 (not a
    total it could subtract itself from), a keyless one no depth at all unless
    COSYQ_METRICS_PUBLIC_QUEUE_DEPTH, an operator's every tenant queue."""
    url = fresh_db(redis_server, "metrics")
    connection = redis.Redis.from_url(url)
    stats = {"state": "idle", "rss_mb": "100"}
    connection.hset(keys.WORKER_STATS_PREFIX + "host.1.aa", mapping=stats)
    front = start_front(tmp_path / "front", url, **KEYS)
    public = start_front(tmp_path / "public", url, **KEYS, COSYQ_METRICS_PUBLIC_QUEUE_DEPTH="1")
    try:
        with front.http(ALPHA) as alpha, front.http(BETA) as beta:
            for client, priority, count in (
                (alpha, "low", 3),
                (alpha, "high", 2),
                (beta, "low", 1),
            ):
                for _ in range(count):
                    job = client.post("/v1/jobs", json={"text": "waiting", "priority": priority})
                    assert job.status_code == 202, job.text
        assert depths(front, BETA) == {HIGH: 0, DEFAULT: 0, LOW: 1}
        assert depths(front, ALPHA) == {HIGH: 2, DEFAULT: 0, LOW: 3}
        assert depths(front, None) == {}
        everyone = depths(front, OPERATOR)
        assert everyone[f"{LOW}.alpha"] == 3 and everyone[f"{HIGH}.alpha"] == 2
        assert everyone[f"{LOW}.beta"] == 1 and everyone[LOW] == 0
        assert depths(public, None) == {HIGH: 2, DEFAULT: 0, LOW: 4}
        assert depths(public, BETA) == {HIGH: 0, DEFAULT: 0, LOW: 1}
    finally:
        front.stop()
        public.stop()
        connection.close()
