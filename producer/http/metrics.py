"""GET /metrics on the HTTP front: the fleet as Redis sees it, for Prometheus (no key needed).

The front runs apart from the workers (often on other hosts), so it cannot sum their
processes' counters as a pool does; it serves what every worker publishes in Redis:
`cosyq_queue_depth{queue}` (every tenant's queues), `cosyq_tenant_queued_jobs{tenant}`,
`cosyq_workers{state}` and `cosyq_worker_rss_bytes{worker}` (from
the `cosyq:worker-stats:*` hashes), under the same names as the pools' `/metrics`. Job counts
and timings come from the pools.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from rq.queue import Queue

from producer.http.context import context_of
from shared import keys, tenants

router = APIRouter()

SCAN_COUNT = 500
MIB = 1024 * 1024


class _Families(Collector):
    """Families computed before the response (the scrape itself is async)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    context = context_of(request)
    aredis = context.aredis
    depth = GaugeMetricFamily("cosyq_queue_depth", "Jobs waiting in a queue", labels=["queue"])
    queued = GaugeMetricFamily(  # tenants come from settings: a bounded label
        "cosyq_tenant_queued_jobs", "Jobs a tenant has waiting, all priorities", labels=["tenant"]
    )
    by_tenant: Counter[str] = Counter()
    for name in tenants.queue_names(context.settings.tenant_names()):
        waiting = float(await aredis.llen(Queue.redis_queue_namespace_prefix + name))
        depth.add_metric([name], waiting)
        by_tenant[tenants.tenant_of_queue(name)] += int(waiting)
    for tenant in context.settings.tenant_names():
        queued.add_metric([tenant], float(by_tenant[tenant]))
    states: Counter[str] = Counter()
    rss = GaugeMetricFamily(
        "cosyq_worker_rss_bytes", "Resident memory of a worker process", labels=["worker"]
    )
    async for key in aredis.scan_iter(match=keys.WORKER_STATS_PREFIX + "*", count=SCAN_COUNT):
        stats = {_text(k): _text(v) for k, v in (await aredis.hgetall(key)).items()}
        states[stats.get("state", "")] += 1
        name = _text(key).removeprefix(keys.WORKER_STATS_PREFIX)
        try:
            rss.add_metric([name], float(stats.get("rss_mb", "0")) * MIB)
        except ValueError:
            continue
    workers = GaugeMetricFamily("cosyq_workers", "Worker processes by state", labels=["state"])
    for state in keys.WORKER_STATES:
        workers.add_metric([state], float(states[state]))
    registry = CollectorRegistry()
    registry.register(_Families([depth, queued, workers, rss]))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
