"""Prometheus metrics: what a worker process records, and the `/metrics` it or its pool serves.

Why multiprocess mode: a pool's workers are separate interpreters that come and go (recycling),
so each one writes its samples to memory-mapped files in a folder the pool owns (the pool sets
PROMETHEUS_MULTIPROC_DIR in its children's environment only) and the pool's `/metrics` sums the
files. When a child exits the pool drops its live gauges (`mark_process_dead`) and folds its
counters and histograms into one archive file per type, so totals survive recycling and the
folder holds a bounded number of files however many processes have come and gone.

A lone `cosyq-worker run` keeps its samples in memory and serves them itself. Neither serves
anything unless COSYQ_METRICS_PORT is set (COSYQ_METRICS_HOST, default 127.0.0.1).
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
import redis
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import start_http_server
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector
from rq.queue import Queue

from shared import keys
from shared.connection import redis_connection
from shared.errors import SettingsError
from shared.logs import get_logger
from shared.settings import Settings
from workers.service.metric_zeros import KnownLabels, known_labels, with_zeros

log = get_logger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
ARCHIVE_PID = "archive"  # dead children's counters and histograms: <type>_archive.db
ADDITIVE_TYPES = ("counter", "histogram")
SCRAPE_SOCKET_TIMEOUT_S = 2.0  # a scrape must answer even while Redis is away

# Worker states as `cosyq status` shows them; the pool adds "waiting" for empty slots.
WORKER_STATES = keys.WORKER_STATES
POOL_WAITING_STATE = "waiting"
JOB_OUTCOMES = ("finished", "failed", "retried", "refused", "canceled")

JOB_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
LOAD_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 900)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)

JOBS = Counter("cosyq_jobs", "Job attempts by outcome", ["queue", "outcome"])
QUALITY = Counter(
    "cosyq_quality_results", "Stored results by quality verdict and action", ["verdict", "action"]
)
QUALITY_RETRIES = Counter("cosyq_quality_retries", "Re-syntheses of suspect audio")
JOB_SECONDS = Histogram("cosyq_job_seconds", "Wall time of one job attempt", buckets=JOB_BUCKETS)
STAGE_SECONDS = Histogram(
    "cosyq_stage_seconds", "Time per stage of a finished job", ["stage"], buckets=STAGE_BUCKETS
)
AUDIO_SECONDS = Counter("cosyq_audio_seconds", "Seconds of audio synthesized")
WORKERS = Gauge(
    "cosyq_workers", "Worker processes by state", ["state"], multiprocess_mode="livesum"
)
RECYCLES = Counter("cosyq_worker_recycles", "Workers that retired, by reason", ["reason"])
RSS_BYTES = Gauge(
    "cosyq_worker_rss_bytes", "Resident memory of a worker process", multiprocess_mode="liveall"
)
MODEL_LOAD_SECONDS = Histogram(
    "cosyq_model_load_seconds", "Engine load time at worker start", buckets=LOAD_BUCKETS
)
BATCH_SIZE = Histogram(
    "cosyq_batch_size", "Requests synthesized together in one engine call", buckets=BATCH_BUCKETS
)
# Stage names: the result's StageTimings fields without "_s" (total is cosyq_job_seconds).
STAGES = ("queue_wait", "frontend", "llm", "flow", "hift", "encode", "store")


# -- recording (worker side) ------------------------------------------------------------------


def record_job(queue: str, outcome: str, seconds: float | None = None) -> None:
    """One attempt ended: finished, failed, retried (will run again), refused or canceled."""
    JOBS.labels(queue=queue, outcome=outcome).inc()
    if seconds is not None:
        JOB_SECONDS.observe(seconds)


def record_stages(stage_seconds: dict[str, float], audio_s: float) -> None:
    """A finished synthesis: its stage times (`<stage>_s` keys) and the audio it made."""
    for stage in STAGES:
        value = stage_seconds.get(f"{stage}_s")
        if value is not None:
            STAGE_SECONDS.labels(stage=stage).observe(value)
    AUDIO_SECONDS.inc(max(0.0, audio_s))


def record_quality(verdict: str, action: str, retries: int) -> None:
    QUALITY.labels(verdict=verdict, action=action).inc()
    if retries:
        QUALITY_RETRIES.inc(retries)


def record_model_load(seconds: float) -> None:
    MODEL_LOAD_SECONDS.observe(seconds)


def record_recycle(reason: str) -> None:
    RECYCLES.labels(reason=reason).inc()


def record_batch(size: int) -> None:
    """For the batching engine: how many requests one engine call synthesized."""
    BATCH_SIZE.observe(size)


def set_worker_state(state: str) -> None:
    """This process's state (1 for it, 0 for the others) and its current RSS."""
    for name in WORKER_STATES:
        WORKERS.labels(state=name).set(1 if name == state else 0)
    RSS_BYTES.set(psutil.Process().memory_info().rss)


# -- collectors (serving side) ----------------------------------------------------------------


class QueueDepthCollector(Collector):
    """cosyq_queue_depth{queue}: cosyq's three queues and any other this process takes.

    Read at scrape time; omitted while Redis cannot answer.
    """

    def __init__(self, connection: redis.Redis, queue_names: Sequence[str]) -> None:
        self.connection = connection
        names = dict.fromkeys([*keys.QUEUES_IN_PRIORITY_ORDER, *queue_names])
        self.queue_keys = {name: Queue.redis_queue_namespace_prefix + name for name in names}

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("cosyq_queue_depth", "Jobs waiting in a queue", labels=["queue"])
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                for key in self.queue_keys.values():
                    pipe.llen(key)
                depths = pipe.execute()
        except redis.RedisError as e:
            log.warning("metrics_queue_depth_unavailable", error=str(e))
            return
        for name, depth in zip(self.queue_keys, depths, strict=True):
            family.add_metric([name], float(depth))
        yield family


def known_families(queue_names: Iterable[str]) -> list[KnownLabels]:
    """The labelled families served at zero before their first event (metric_zeros)."""
    return known_labels(list(queue_names), JOB_OUTCOMES, STAGES, STAGE_BUCKETS)


class PoolCollector(Collector):
    """The children's files, summed; plus the pool's empty slots as cosyq_workers{waiting}.

    Shares a lock with `fold_dead_process`, so a scrape never sees a dead child's samples both
    in its own file and in the archive. Known label sets are filled in at zero (`known`).
    """

    def __init__(
        self,
        directory: str,
        lock: threading.Lock,
        waiting_slots: Callable[[], int],
        known: Sequence[KnownLabels] = (),
    ):
        self.directory = directory
        self.lock = lock
        self.waiting_slots = waiting_slots
        self.known = known

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            files = glob.glob(os.path.join(self.directory, "*.db"))
            merged = MultiProcessCollector.merge(files, accumulate=True)
            families = list(with_zeros(merged, self.known))
        waiting = float(self.waiting_slots())
        workers = next((f for f in families if f.name == "cosyq_workers"), None)
        if workers is None:
            workers = GaugeMetricFamily("cosyq_workers", "Worker processes by state")
            families.append(workers)
        workers.add_sample("cosyq_workers", {"state": POOL_WAITING_STATE}, waiting)
        yield from families


def fold_dead_process(directory: str, pid: int, lock: threading.Lock) -> None:
    """A child exited: drop its live gauges, add its counters/histograms into the archive."""
    with lock:
        mark_process_dead(pid, directory)
        for kind in ADDITIVE_TYPES:
            path = os.path.join(directory, f"{kind}_{pid}.db")
            if not os.path.exists(path):
                continue
            archive = MmapedDict(os.path.join(directory, f"{kind}_{ARCHIVE_PID}.db"))
            try:
                for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(path):
                    total, _ = archive.read_value(key)
                    archive.write_value(key, total + value, 0.0)
            finally:
                archive.close()
            os.remove(path)
        # Gauges in other modes (none today) would be left behind by a dead pid: drop them.
        for stale in glob.glob(os.path.join(directory, f"gauge_*_{pid}.db")):
            os.remove(stale)


# -- serving ----------------------------------------------------------------------------------


@dataclass
class MetricsServer:
    """A running `/metrics` endpoint (a daemon thread); `close()` stops it."""

    server: Any
    thread: threading.Thread
    address: str

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
    """Start the HTTP endpoint; a port that cannot be bound is a configuration error."""
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise SettingsError(
            f"COSYQ_METRICS_PORT: cannot serve metrics on {host}:{port}: {e.strerror or e}"
        ) from e
    address = f"http://{host}:{server.server_port}/metrics"
    log.info("metrics_serving", address=address)
    return MetricsServer(server, thread, address)


def scrape_connection(settings: Settings) -> redis.Redis:
    """A client of its own with a short read timeout, so a scrape never hangs on Redis."""
    return redis_connection(settings, read_timeout_s=SCRAPE_SOCKET_TIMEOUT_S)


def worker_registry(settings: Settings, queue_names: Iterable[str]) -> CollectorRegistry:
    """A lone worker's metrics: its own samples (in memory) and the queue depths."""
    registry = CollectorRegistry()
    names = list(queue_names)
    source: Collector
    if os.environ.get(MULTIPROC_ENV):  # an operator's multiprocess setup: read its folder
        source = MultiProcessCollector(None, os.environ[MULTIPROC_ENV])
    else:
        source = _DefaultRegistryView()
    registry.register(_ZeroFilled(source, known_families(names)))
    registry.register(QueueDepthCollector(scrape_connection(settings), names))
    return registry


def pool_registry(
    directory: str,
    lock: threading.Lock,
    waiting_slots: Callable[[], int],
    settings: Settings,
    queue_names: Iterable[str],
) -> CollectorRegistry:
    registry = CollectorRegistry()
    names = list(queue_names)
    registry.register(PoolCollector(directory, lock, waiting_slots, known_families(names)))
    registry.register(QueueDepthCollector(scrape_connection(settings), names))
    return registry


class _ZeroFilled(Collector):
    """Another collector's families with the known label sets filled in at zero."""

    def __init__(self, source: Collector, known: Sequence[KnownLabels]) -> None:
        self.source = source
        self.known = known

    def collect(self) -> Iterator[Metric]:
        yield from with_zeros(self.source.collect(), self.known)


class _DefaultRegistryView(Collector):
    """The cosyq_* families of the process's default registry (not python/process/gc ones)."""

    def collect(self) -> Iterator[Metric]:
        for family in REGISTRY.collect():
            if family.name.startswith("cosyq_"):
                yield family
