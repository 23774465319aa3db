"""GET /metrics on the HTTP front: the fleet as Redis sees it, for Prometheus.

The front runs apart from the workers (often on other hosts), so it cannot sum their
processes' counters as a pool does; it serves what every worker publishes in Redis:
`cosyq_queue_depth{queue}`, `cosyq_workers{state}` and `cosyq_worker_rss_bytes{worker}` (from
the `cosyq:worker-stats:*` hashes), under the same names as the pools' `/metrics`. Job counts
and timings come from the pools.

Queue depths are per tenant (`scope_of`). A scrape with an operator key (COSYQ_OPERATOR_KEYS),
or any scrape of a front without keys (loopback only), gets every tenant's queue in
`cosyq_queue_depth` and `cosyq_tenant_queued_jobs{tenant}`. A tenant key gets its own tenant's
queues only, labelled by priority queue (`cosyq-high`, ...; no tenant name): nothing summed over
other tenants, so it cannot subtract itself from a total and learn theirs. No key (Prometheus
without credentials, or a tenant leaving its key out) gets no queue depth at all, only the fleet
gauges `cosyq_workers` and `cosyq_worker_rss_bytes`, unless COSYQ_METRICS_PUBLIC_QUEUE_DEPTH
restores the per-priority totals over every tenant (their combined depth, public). A wrong key
is a 401 like everywhere else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from rq.queue import Queue
from starlette.concurrency import run_in_threadpool

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


def scope_of(request: Request) -> tuple[bool, tuple[str, ...]]:
    """(may name tenants, the queues whose depths this scrape may see); 401 for a wrong key.

    An operator key, or any scrape of a front without keys: every tenant's queue, named. A
    tenant key: its own tenant's queues only. No key: none, unless
    COSYQ_METRICS_PUBLIC_QUEUE_DEPTH (then every tenant's, summed per priority)."""
    settings = context_of(request).settings
    every = tenants.queue_names(settings.tenant_names())
    check: KeyCheck = request.app.state.key_check
    if not check.enabled:
        return True, every
    if "authorization" not in request.headers:
        return False, every if settings.metrics_public_queue_depth else ()
    tenant, operator = check.caller_of(request)
    return (True, every) if operator else (False, tenants.tenant_queues(tenant))


async def _queue_families(request: Request) -> list[Metric]:
    """Queue depths: per tenant queue (and per tenant) when tenants may be named, else per
    priority queue over the queues the scrape may see (its own tenant's, or every one)."""
    named, names = await run_in_threadpool(scope_of, request)  # first: a wrong key reads nothing
    if not names:
        return []
    aredis = context_of(request).aredis
    waiting = [int(await aredis.llen(Queue.redis_queue_namespace_prefix + n)) for n in names]
    return _per_tenant(names, waiting) if named else [_per_priority(names, waiting)]


def _depth_family() -> GaugeMetricFamily:
    return GaugeMetricFamily("cosyq_queue_depth", "Jobs waiting in a queue", labels=["queue"])


def _per_priority(names: tuple[str, ...], waiting: list[int]) -> Metric:
    """`cosyq_queue_depth` per priority queue, the given queues' jobs summed."""
    by_priority: Counter[str] = Counter()
    for name, count in zip(names, waiting, strict=True):
        by_priority[tenants.priority_of_queue(name)] += count
    depth = _depth_family()
    for name in keys.QUEUES_IN_PRIORITY_ORDER:
        depth.add_metric([name], float(by_priority[name]))
    return depth


def _per_tenant(names: tuple[str, ...], waiting: list[int]) -> list[Metric]:
    """`cosyq_queue_depth` per tenant queue and `cosyq_tenant_queued_jobs` per tenant."""
    depth = _depth_family()
    queued = GaugeMetricFamily(  # tenants come from settings: a bounded label
        "cosyq_tenant_queued_jobs", "Jobs a tenant has waiting, all priorities", labels=["tenant"]
    )
    by_tenant: Counter[str] = Counter()
    for name, count in zip(names, waiting, strict=True):
        depth.add_metric([name], float(count))
        by_tenant[tenants.tenant_of_queue(name)] += count
    for tenant, count in by_tenant.items():
        queued.add_metric([tenant], float(count))
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
