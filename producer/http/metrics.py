"""GET /metrics on the HTTP front: the fleet as Redis sees it, for Prometheus (no key needed).

The front runs apart from the workers (often on other hosts), so it cannot sum their
processes' counters as a pool does; it serves what every worker publishes in Redis:
`cosyq_queue_depth{queue}`, `cosyq_workers{state}` and `cosyq_worker_rss_bytes{worker}` (from
the `cosyq:worker-stats:*` hashes), under the same names as the pools' `/metrics`. Job counts
and timings come from the pools.

Tenant names are an operator's to see: a scrape with an operator key (COSYQ_OPERATOR_KEYS), or
any scrape of a front without keys (loopback only), gets every tenant's queue in
`cosyq_queue_depth` and `cosyq_tenant_queued_jobs{tenant}`. Any other scrape (no key, a tenant
key) gets `cosyq_queue_depth` per priority queue, summed over the tenants, and no tenant label;
a wrong key is a 401 like everywhere else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from rq.queue import Queue

from producer.http.auth import KeyCheck
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


def may_name_tenants(request: Request) -> bool:
    """An operator key's scrape, or any on a front without keys; 401 for a wrong key."""
    check: KeyCheck = request.app.state.key_check
    if not check.enabled:
        return True
    if "authorization" not in request.headers:
        return False
    return check.caller_of(request)[1]


async def _queue_families(request: Request) -> list[Metric]:
    """Queue depths: per tenant queue (and per tenant) when tenants may be named, else per
    priority queue, every tenant's summed."""
    named = may_name_tenants(request)  # first: a wrong key reads nothing
    context = context_of(request)
    depth = GaugeMetricFamily("cosyq_queue_depth", "Jobs waiting in a queue", labels=["queue"])
    queued = GaugeMetricFamily(  # tenants come from settings: a bounded label
        "cosyq_tenant_queued_jobs", "Jobs a tenant has waiting, all priorities", labels=["tenant"]
    )
    by_tenant: Counter[str] = Counter()
    by_priority: Counter[str] = Counter()
    names = tenants.queue_names(context.settings.tenant_names())
    waiting = [await context.aredis.llen(Queue.redis_queue_namespace_prefix + n) for n in names]
    for name, count in zip(names, waiting, strict=True):
        by_tenant[tenants.tenant_of_queue(name)] += int(count)
        by_priority[tenants.priority_of_queue(name)] += int(count)
    if not named:
        for name in keys.QUEUES_IN_PRIORITY_ORDER:
            depth.add_metric([name], float(by_priority[name]))
        return [depth]
    for name, count in zip(names, waiting, strict=True):
        depth.add_metric([name], float(count))
    for tenant in context.settings.tenant_names():
        queued.add_metric([tenant], float(by_tenant[tenant]))
    return [depth, queued]


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    families = await _queue_families(request)
    aredis = context_of(request).aredis
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
    registry.register(_Families([*families, workers, rss]))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
