"""A worker process's start-up and shutdown, in the order they must happen.

Start: logging; refuse a Rosetta-translated Python; per-worker thread budget (before torch
loads); housekeeping (its first tick reaps jobs a dead predecessor left); tell the pool we are
loading; probe storage (write, read back, delete; before the model load, which takes minutes);
load the engine and warm it up; install the job functions' runtime; log `worker_ready` and tell
the pool. A failure before `worker_ready` is logged once, sent to the pool, recorded for
`cosyq status` and raised, so the process exits non-zero without ever taking a job; storage
that fails its probe again mid-run (`recheck_storage`, `storage_lost`) is reported the same
way. Everything here takes plain values (settings, names, a connection, the pool channel),
never the worker.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis
from rq.queue import Queue
from rq.serializers import JSONSerializer

from shared.connection import follow_master, redis_connection
from shared.errors import CosyqError, StorageError
from shared.eviction import warn_if_evicting
from shared.job_events import WebhookPolicy
from shared.jobs import RequestLimits
from shared.logs import configure_logging, get_logger
from shared.settings import Settings
from shared.start_failures import NO_SLOT, clear_start_failure, record_start_failure
from shared.storage import Storage, open_storage
from shared.storage_probe import ProbeOutcome, wait_for_storage
from shared.storage_retry import Backoff
from shared.voices import VoiceRegistry
from workers.documents.cleanup import SegmentCleanup
from workers.documents.expiry import ExpiredSegments
from workers.documents.keepalive import DocumentKeepalive
from workers.documents.outputs_expiry import ExpiredOutputs
from workers.documents.sweep import AssemblySweep
from workers.service import control, host, metrics
from workers.service.admission import CosyqJob
from workers.service.audio_expiry import ExpiredAudio
from workers.service.cancels import ExpiredCancels
from workers.service.engine_loading import LoadedEngine, load_engine
from workers.service.housekeeping import Housekeeper, WorkerState, WorkerStats, utc_now_iso
from workers.service.job_runtime import WorkerRuntime, install_runtime, prompt_roots
from workers.service.orphans import OrphanSweep
from workers.service.outage import wait_for_redis
from workers.service.reaper import Reaper, release_job
from workers.service.webhook_bodies import UnkeptBodies
from workers.voices.book import VoiceBook
from workers.voices.uploads import VoiceUploadSweep

log = get_logger(__name__)


@dataclass(frozen=True)
class WorkerIdentity:
    """What names one worker process in logs, stats and the pool's messages."""

    name: str
    hostname: str
    queue_names: tuple[str, ...]
    slot: int | None = None


class WorkerLifecycle:
    """Start-up and shutdown of one worker process (see module docstring)."""

    def __init__(
        self,
        settings: Settings,
        identity: WorkerIdentity,
        connection: redis.Redis,
        *,
        channel: control.ControlChannel | None,
        job_budget: int,
    ) -> None:
        self.settings = settings
        self.identity = identity
        self.connection = connection
        self.channel = channel
        self.job_budget = job_budget
        self.device = "cpu"
        self.threads = 1
        self.housekeeper = build_housekeeper(settings, identity)
        self._parent_pid = os.getppid()
        self._orphan_noted = False
        self._storage: Storage | None = None  # probed at start, probed again after a failure

    def start(
        self,
        duties: Sequence[Callable[[], None]] = (),
        before_ready: Callable[[], None] | None = None,
    ) -> None:
        """Load and announce; `duties` run on every housekeeping tick from then on;
        `before_ready` runs once loaded, before the worker says it is ready (its stop signals)."""
        configure_logging(self.settings)  # again is harmless; `rq worker -w` never did it
        translated = host.is_translated()
        facts = host.host_facts(translated)
        name = self.identity.name
        try:
            host.refuse_translated(translated, allow_rosetta=self.settings.allow_rosetta)
            self.threads = host.threads_per_worker(
                self.settings.threads, self.settings.pool_size, facts.physical_cores
            )
            host.limit_threads_before_load(self.threads, self.settings.pool_size)
            self.housekeeper.extra_duties.extend(duties)
            self.housekeeper.extra_duties.append(self._follow_master)
            self.housekeeper.extra_duties.append(
                AssemblySweep(self.housekeeper.connection, self.settings, holder=name)
            )
            self.housekeeper.extra_duties.append(
                DocumentKeepalive(self.housekeeper.connection, self.settings, holder=name)
            )
            self.housekeeper.extra_duties.append(
                UnkeptBodies(self.housekeeper.connection, self.settings, holder=name)
            )
            self.housekeeper.extra_duties.append(
                ExpiredCancels(
                    self.housekeeper.connection,
                    self.settings,
                    holder=name,
                    queues=self.housekeeper.queues,
                )
            )
            if self.channel is not None:
                self.housekeeper.extra_duties.append(self._watch_parent)
            self.housekeeper.stats.state = WorkerState.LOADING
            self.housekeeper.start()
            self._send(control.LOADING, name)
            log.info("worker_loading", worker=name, slot=self.identity.slot)
            storage = self._probe_storage()
            cleanup = SegmentCleanup(
                self.housekeeper.connection, self.settings, holder=name, storage=storage
            )
            self.housekeeper.extra_duties.append(cleanup)  # deletes through the probed storage
            self.housekeeper.extra_duties.append(
                ExpiredSegments(
                    self.housekeeper.connection, self.settings, holder=name, storage=storage
                )
            )
            self.housekeeper.extra_duties.append(
                VoiceUploadSweep(
                    self.housekeeper.connection, self.settings, holder=name, storage=storage
                )
            )
            self.housekeeper.extra_duties.append(
                ExpiredAudio(
                    self.housekeeper.connection, self.settings, holder=name, storage=storage
                )
            )
            self.housekeeper.extra_duties.append(
                ExpiredOutputs(
                    self.housekeeper.connection, self.settings, holder=name, storage=storage
                )
            )
            loaded = load_engine(self.settings)
        except CosyqError as e:
            log.error("worker_start_failed", worker=name, error=str(e))
            self._send(control.FAILED, f"{type(e).__name__}: {e}")
            self._record_failure(f"{type(e).__name__}: {e}")
            raise
        host.limit_threads_after_load(self.threads)
        self._install(loaded, storage)
        wait_for_redis(self.connection)
        if self.channel is None:  # a pool's slot: the pool warned
            warn_if_evicting(self.connection, "worker")
        if before_ready is not None:
            before_ready()
        self._announce_ready(loaded, facts)

    def stop(self) -> None:
        self.housekeeper.stop()
        install_runtime(None)
        if self.channel is not None:
            self.channel.close()

    def release_started(self, job_id: str, execution_id: str, queue_name: str) -> None:
        """Cold shutdown: hand the running job back now instead of waiting for the reaper.

        A fresh connection: the signal handler may have interrupted a command on any other.
        """
        connection = redis_connection(self.settings)
        queue = Queue(
            queue_name, connection=connection, job_class=CosyqJob, serializer=JSONSerializer
        )
        try:
            release_job(
                connection,
                queue,
                f"{job_id}:{execution_id}",
                kind="worker_died",
                message="worker died: stopped (second signal) while running this job",
                webhooks=WebhookPolicy.from_settings(self.settings),
            )
        except redis.RedisError as e:
            log.warning("give_back_failed", job_id=job_id, error=str(e))
        finally:
            connection.close()

    def recheck_storage(self) -> ProbeOutcome:
        """The start-up probe again, on the storage jobs write to (after a storage failure)."""
        if self._storage is None:
            raise RuntimeError("storage is probed again only after the worker started")
        return self._wait_for_storage(self._storage)

    def storage_lost(self, outcome: ProbeOutcome) -> StorageError:
        """Storage failed its probe mid-run: reported as a failed start is (log, pool, `cosyq
        status`); the worker raises the returned error once it has stopped taking jobs."""
        error = StorageError(outcome.line)
        reason = f"{type(error).__name__}: {error}"
        log.error("worker_storage_lost", worker=self.identity.name, error=str(error))
        self._send(control.FAILED, reason)
        self._record_failure(reason)
        return error

    def _probe_storage(self) -> Storage:
        """The storage jobs will write to, once a probe object went there and back."""
        storage = open_storage(self.settings)
        outcome = self._wait_for_storage(storage)
        if not outcome.ok:
            raise StorageError(outcome.line)
        log.info(
            "storage_ready",
            url=outcome.url,
            probe_s=round(outcome.elapsed_s, 3),
            attempts=outcome.attempts,
            warning=outcome.warning or None,
        )
        self._storage = storage
        return storage

    def _wait_for_storage(self, storage: Storage) -> ProbeOutcome:
        def on_retry(outcome: ProbeOutcome, delay_s: float) -> None:
            log.warning(
                "storage_probe_retry",
                url=outcome.url,
                cause=outcome.cause,
                attempt=outcome.attempts,
                retry_in_s=delay_s,
            )

        return wait_for_storage(
            storage,
            wait_s=self.settings.storage_probe_wait_s,
            backoff=Backoff.from_settings(self.settings),
            on_retry=on_retry,
        )

    def _place(self) -> dict[str, str]:
        """Where this worker runs, as `cosyq status` groups start-up failures."""
        slot = self.identity.slot
        return {"host": socket.gethostname(), "slot": NO_SLOT if slot is None else str(slot)}

    def _record_failure(self, reason: str) -> None:
        try:
            record_start_failure(
                self.housekeeper.connection,
                **self._place(),
                worker=self.identity.name,
                reason=reason,
                ttl_s=self.settings.start_failure_ttl_s,
                count=self.channel is None,  # under a pool, the pool counts
            )
        except redis.RedisError as e:
            log.warning("start_failure_unrecorded", error=str(e))

    def _install(self, loaded: LoadedEngine, storage: Storage) -> None:
        engine, settings = loaded.engine, self.settings
        voices = VoiceBook(
            engine,
            storage,
            model_dir=settings.model_dir,
            registry=VoiceRegistry(self.connection),
            max_prompt_seconds=settings.max_prompt_seconds,
            cache_ttl_s=settings.default_voice_cache_ttl_s,
        )
        voices.prepare_default()
        install_runtime(
            WorkerRuntime(
                settings=settings,
                engine=engine,
                storage=storage,
                voices=voices,
                limits=RequestLimits.from_settings(settings),
                worker_name=self.identity.name,
                worker_pid=os.getpid(),
                prompt_roots=prompt_roots(settings),
            )
        )
        self.device = engine.identity.device

    def _announce_ready(self, loaded: LoadedEngine, facts: host.HostFacts) -> None:
        identity = loaded.engine.identity
        stats = self.housekeeper.stats
        stats.backend, stats.device, stats.model = identity.backend, identity.device, identity.name
        stats.family = identity.family
        stats.threads, stats.ready_at = self.threads, utc_now_iso()
        metrics.record_model_load(loaded.load_s)
        self.housekeeper.set_state(WorkerState.IDLE)
        try:
            clear_start_failure(self.housekeeper.connection, **self._place())
        except redis.RedisError as e:
            log.warning("start_failure_not_cleared", error=str(e))
        log.info(
            "worker_ready",
            worker=self.identity.name,
            pid=os.getpid(),
            slot=self.identity.slot,
            load_s=round(loaded.load_s, 3),
            warm_up_s=round(loaded.warm_up_s, 3),
            imports_s=round(loaded.imports_s, 3),
            platform=facts.platform,
            arch=facts.arch,
            translated=facts.translated,
            backend=identity.backend,
            device=identity.device,
            threads=self.threads,
            model=identity.name,
            family=identity.family,
            checkpoint_hash=identity.checkpoint_hash,
            job_budget=self.job_budget,
            queues=list(self.identity.queue_names),
        )
        self._send(control.READY)

    def _send(self, event: str, detail: str = "") -> None:
        if self.channel is not None:
            self.channel.send(event, detail)

    def _follow_master(self) -> None:
        """Sentinel: move both clients to a new master within one housekeeping tick."""
        for connection in (self.connection, self.housekeeper.connection):
            if follow_master(connection):
                log.warning("redis_master_changed", worker=self.identity.name)

    def _watch_parent(self) -> None:
        """A pool child whose pool died stops warmly instead of running on as an orphan. An
        exec-started worker's parent is the pool; a forked one's is the template, which outlives
        a killed pool: for it, only the control channel's end tells."""
        if self._orphan_noted or self.channel is None:
            return
        if os.getppid() != self._parent_pid or self.channel.pool_gone():
            self._orphan_noted = True
            log.warning("worker_orphaned", parent_pid=self._parent_pid)
            os.kill(os.getpid(), signal.SIGTERM)


def build_housekeeper(settings: Settings, identity: WorkerIdentity) -> Housekeeper:
    """The heartbeat thread's duties, on a Redis pool of its own (never stuck behind a pop)."""
    side = redis_connection(settings)
    quick = max(1.0, settings.heartbeat_ttl_s / 2)  # a stuck call must not outlive the TTL
    side.connection_pool.connection_kwargs.update(socket_timeout=quick)
    names = list(identity.queue_names)
    stats = WorkerStats(
        name=identity.name,
        pid=os.getpid(),
        host=identity.hostname,
        queues=",".join(names),
        slot="" if identity.slot is None else str(identity.slot),
    )
    queues = [
        Queue(name, connection=side, job_class=CosyqJob, serializer=JSONSerializer)
        for name in names
    ]
    webhooks = WebhookPolicy.from_settings(settings)
    reaper = Reaper(side, names, heartbeat_ttl_s=settings.heartbeat_ttl_s, webhooks=webhooks)
    return Housekeeper(
        side,
        stats,
        reaper,
        queues,
        interval_s=settings.heartbeat_interval_s,
        ttl_s=settings.heartbeat_ttl_s,
        wait_replicas=settings.redis_wait_replicas,
        wait_timeout_s=settings.redis_wait_timeout_s,
        orphans=OrphanSweep(
            side,
            orphan_after_s=settings.orphan_after_s,
            batch=settings.orphan_sweep_batch,
            holder=identity.name,
        ),
    )
