"""`cosyq-worker pool -n K`: K worker slots, each a fresh interpreter, restarted when it exits.

Why not `rq worker-pool`: it forks (unsafe after Core ML/Metal) and has no max-jobs. Why not
honcho alone: it stops everything when one process exits, and workers exit on purpose. So the
pool is the Procfile's long-lived process, and it:
- starts each worker with `python -m workers.cli run` (exec, never a fork of a torch process),
  or with COSYQ_POOL_START=template on Linux forks it from a template that only imported the
  worker's modules (workers/service/template.py);
- lets one slot load at a time (a slot loads until its worker says `ready` on its control
  channel, a socket pair);
- grants recycling one slot at a time: a worker that reached a soft limit says `retiring` and
  keeps working until the pool, seeing every other slot ready, answers `retire` on the channel;
  the worker reads it between jobs and exits. So recycling never leaves fewer than K-1 ready
  workers, and a grant never lands in the middle of a dequeue;
- restarts any worker that exits, whatever the code; one that dies before `ready` backs off
  exponentially (capped), with the reason it gave logged and kept for `cosyq status`;
- when a worker dies unexpectedly, releases its running job at once (retry or "worker died");
- forwards SIGTERM/SIGINT to every slot as a warm shutdown and waits for them all;
- with COSYQ_METRICS_PORT set, serves every slot's metrics, summed (workers/service/metrics.py).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from types import FrameType

import redis

from shared import tenants
from shared.connection import follow_master, redis_connection
from shared.job_events import WebhookPolicy
from shared.logs import get_logger
from shared.settings import Settings
from shared.start_failures import record_backoff
from workers.service import control, metrics
from workers.service.reaper import Reaper, forget_worker
from workers.service.template import TEMPLATE, ForkedWorker, WorkerTemplate, preload_modules
from workers.service.template import start_mode as worker_start_mode

log = get_logger(__name__)

READ_CHUNK = 4096
MIN_WAIT_S = 0.01  # the shortest wait for events: a slot due now never spins the loop


@dataclass(frozen=True)
class PoolConfig:
    """Pool options; the backoff limits are named here with their defaults."""

    size: int
    queues: tuple[str, ...] = ()
    backoff_initial_s: float = 1.0  # first wait after a worker died during start-up
    backoff_max_s: float = 60.0  # cap of the doubling wait
    poll_s: float = 0.5  # longest sleep between checks for exited workers

    def backoff_s(self, failures: int) -> float:
        """Exponential, capped: initial, 2x, 4x, ... for consecutive start-up failures."""
        return float(min(self.backoff_max_s, self.backoff_initial_s * 2 ** max(0, failures - 1)))


class SlotState(StrEnum):
    WAITING = "waiting"  # no process: about to start, or backing off after a crash
    LOADING = "loading"  # started, not yet ready (one slot at a time)
    READY = "ready"
    STOPPING = "stopping"  # told to retire, or the pool is stopping


@dataclass
class Slot:
    """One place for a worker; holds at most one process at a time."""

    index: int
    process: subprocess.Popen[bytes] | ForkedWorker | None = None
    control_fd: int | None = None
    reader: control.LineReader = field(default_factory=control.LineReader)
    state: SlotState = SlotState.WAITING
    worker_name: str = ""
    started_at: float = 0.0
    failures: int = 0  # consecutive deaths before `ready`
    not_before: float = 0.0  # crash-loop backoff
    last_failure: str = ""
    retire_reason: str = ""  # the worker asked to be recycled; granted one at a time

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


class Pool:
    """Runs until SIGTERM/SIGINT; `run()` returns the exit status (0 after a clean stop)."""

    def __init__(self, config: PoolConfig, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.slots = [Slot(index) for index in range(config.size)]
        self.signals_received = 0
        self._connection = redis_connection(settings)
        queue_names = config.queues or tenants.queue_names(settings.tenant_names())
        self._reaper = Reaper(
            self._connection,
            queue_names,
            heartbeat_ttl_s=settings.heartbeat_ttl_s,
            webhooks=WebhookPolicy.from_settings(settings),
        )
        self._next_reap = 0.0
        self._wake_r, self._wake_w = os.pipe()
        self._queue_names = queue_names
        self._metrics_dir: str | None = None  # the children's PROMETHEUS_MULTIPROC_DIR
        self._metrics_lock = threading.Lock()
        self._metrics_server: metrics.MetricsServer | None = None
        self._start_mode = worker_start_mode(settings)
        self._template: WorkerTemplate | None = None

    # -- main loop ---------------------------------------------------------------------------

    def run(self) -> int:
        self._install_signals()
        log.info("pool_started", size=self.config.size, pid=os.getpid())
        try:
            self._start_metrics()
            self._start_template()
            while True:
                self._collect_exits()
                if self.stopping and not self._live_slots():
                    break  # at once, not one more wait for events that will not come
                if not self.stopping:
                    self._start_next_slot()
                    self._grant_retirement()
                    self._reap_periodically()
                self._wait_for_events()
        finally:
            self._close_fds()
            self._stop_metrics()
        log.info("pool_stopped")
        return 0

    @property
    def stopping(self) -> bool:
        return self.signals_received > 0

    def _live_slots(self) -> list[Slot]:
        return [slot for slot in self.slots if slot.process is not None]

    # -- metrics -----------------------------------------------------------------------------

    def _start_metrics(self) -> None:
        """A fresh folder for the children's samples, and /metrics summing them."""
        port = self.settings.metrics_port
        if port is None:
            return
        self._metrics_dir = tempfile.mkdtemp(prefix="cosyq-metrics-")
        registry = metrics.pool_registry(
            self._metrics_dir,
            self._metrics_lock,
            lambda: sum(slot.process is None for slot in self.slots),
            self.settings,
            self._queue_names,
        )
        self._metrics_server = metrics.serve(registry, self.settings.metrics_host, port)
        log.info("pool_metrics", address=self._metrics_server.address, folder=self._metrics_dir)

    def _stop_metrics(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.close()
        if self._metrics_dir is not None:
            shutil.rmtree(self._metrics_dir, ignore_errors=True)

    # -- starting ----------------------------------------------------------------------------

    def _worker_env(self) -> dict[str, str]:
        env = dict(os.environ, COSYQ_POOL_SIZE=str(self.config.size))
        if self._metrics_dir is not None:
            env[metrics.MULTIPROC_ENV] = self._metrics_dir
        return env

    def _start_template(self) -> None:
        """Template mode: the one process the workers fork from, importing before the first."""
        if self._start_mode != TEMPLATE:
            return
        modules = preload_modules(
            self.settings.engine, quality_imports=self.settings.quality_import_at_start
        )
        env = self._worker_env()
        if self._metrics_dir is not None:  # its own samples (zeros) apart: each fork's are new
            env[metrics.MULTIPROC_ENV] = os.path.join(self._metrics_dir, "template")
            os.mkdir(env[metrics.MULTIPROC_ENV])
        self._template = WorkerTemplate(modules, env)
        seconds = self._template.start()
        log.info("pool_template_ready", modules=modules, start_s=round(seconds, 3))

    def _start_next_slot(self) -> None:
        """Start one waiting slot, unless another is loading (one load at a time)."""
        if any(slot.state is SlotState.LOADING for slot in self.slots):
            return
        now = time.monotonic()
        ready = [s for s in self.slots if s.state is SlotState.WAITING and s.not_before <= now]
        if ready:
            self._spawn(min(ready, key=lambda s: s.not_before))

    def _spawn(self, slot: Slot) -> None:
        ours, theirs = socket.socketpair()  # both ways: events up, the retirement grant down
        read_fd, write_fd = ours.detach(), theirs.detach()
        os.set_blocking(read_fd, False)
        arguments = ["run", *self.config.queues, "--slot", str(slot.index)]
        try:
            if self._template is not None:
                with socket.socket(fileno=os.dup(write_fd)) as theirs_copy:
                    slot.process = self._template.fork(
                        arguments, self._worker_env(), control=theirs_copy
                    )
            else:
                # A new session: a terminal's Ctrl+C reaches the pool only, which forwards it.
                slot.process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "workers.cli",
                        *arguments,
                        "--control-fd",
                        str(write_fd),
                    ],
                    env=self._worker_env(),
                    pass_fds=(write_fd,),
                    start_new_session=True,
                )
        finally:
            os.close(write_fd)
        slot.control_fd, slot.reader = read_fd, control.LineReader()
        slot.state, slot.worker_name, slot.retire_reason = SlotState.LOADING, "", ""
        slot.started_at = time.monotonic()
        log.info("slot_started", slot=slot.index, pid=slot.pid, restarts_failed=slot.failures)
        if self.stopping:  # the stop signal came while this slot was starting: it missed it
            slot.state = SlotState.STOPPING
            slot.process.send_signal(signal.SIGTERM)

    # -- messages from workers ---------------------------------------------------------------

    def _wait_for_events(self) -> None:
        watched = {s.control_fd: s for s in self.slots if s.control_fd is not None}
        ended = [s.process.sentinel for s in self.slots if isinstance(s.process, ForkedWorker)]
        timeout = self._wait_s()
        try:
            readable, _, _ = select.select([self._wake_r, *watched, *ended], [], [], timeout)
        except InterruptedError:
            return
        for fd in readable:
            if fd == self._wake_r:
                os.read(self._wake_r, READ_CHUNK)
            elif fd in watched:
                self._read_control(watched[fd])

    def _wait_s(self) -> float:
        """At most `poll_s`; less when a backing-off slot may start sooner, so that it starts
        when its backoff ends rather than up to `poll_s` later."""
        if self.stopping or any(slot.state is SlotState.LOADING for slot in self.slots):
            return self.config.poll_s
        now = time.monotonic()
        ends = [s.not_before - now for s in self.slots if s.state is SlotState.WAITING]
        return max(MIN_WAIT_S, min([self.config.poll_s, *ends]))

    def _read_control(self, slot: Slot) -> None:
        assert slot.control_fd is not None
        try:
            data = os.read(slot.control_fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:  # reset by a worker that died
            data = b""
        if not data:  # the worker closed its end (exiting); its exit is collected by poll()
            os.close(slot.control_fd)
            slot.control_fd = None
            return
        for message in slot.reader.feed(data):
            self._on_message(slot, message)

    def _on_message(self, slot: Slot, message: control.ControlMessage) -> None:
        if message.event == control.LOADING:
            slot.worker_name = message.detail
        elif message.event == control.READY:
            slot.state, slot.failures = SlotState.READY, 0
            load_s = round(time.monotonic() - slot.started_at, 3)
            log.info(
                "slot_ready",
                slot=slot.index,
                pid=slot.pid,
                worker=slot.worker_name,
                start_to_ready_s=load_s,
            )
        elif message.event == control.RETIRING:
            slot.retire_reason = message.detail or "recycle"
            log.info("slot_retire_requested", slot=slot.index, reason=slot.retire_reason)
        elif message.event == control.FAILED:
            slot.last_failure = message.detail

    # -- recycling ---------------------------------------------------------------------------

    def _grant_retirement(self) -> None:
        """Let one retiring worker go, but only when every other slot is ready or crashed."""
        for slot in self.slots:
            if slot.state in {SlotState.LOADING, SlotState.STOPPING}:
                return
            if slot.state is SlotState.WAITING and slot.failures == 0:
                return  # about to start: it will be loading
        for slot in self.slots:
            if slot.retire_reason and slot.state is SlotState.READY and slot.process is not None:
                slot.state = SlotState.STOPPING
                self._send_retire(slot)
                log.info("slot_retire_granted", slot=slot.index, reason=slot.retire_reason)
                return

    def _send_retire(self, slot: Slot) -> None:
        """The grant goes over the channel: the worker reads it between jobs, never mid-pop."""
        if slot.control_fd is not None:
            with contextlib.suppress(OSError):  # gone already: its exit is collected next
                os.write(slot.control_fd, control.encode(control.RETIRE))
                return
        if slot.process is not None:  # no channel left: a stop signal is just as safe
            slot.process.send_signal(signal.SIGTERM)

    # -- exits -------------------------------------------------------------------------------

    def _collect_exits(self) -> None:
        for slot in self.slots:
            if slot.process is None or (code := slot.process.poll()) is None:
                continue
            was_loading = slot.state is SlotState.LOADING
            expected = self.stopping or (slot.state is SlotState.STOPPING and code == 0)
            if slot.control_fd is not None:
                self._drain(slot)
            self._log_exit(slot, code, was_loading)
            if self._metrics_dir is not None:
                metrics.fold_dead_process(self._metrics_dir, slot.process.pid, self._metrics_lock)
            if not expected:
                self._release_jobs_of(slot)
            slot.process, slot.state = None, SlotState.WAITING

    def _drain(self, slot: Slot) -> None:
        """Read the last messages (a `failed` reason) before closing the pipe."""
        assert slot.control_fd is not None
        try:
            while data := os.read(slot.control_fd, READ_CHUNK):
                for message in slot.reader.feed(data):
                    self._on_message(slot, message)
        except BlockingIOError:
            pass
        os.close(slot.control_fd)
        slot.control_fd = None

    def _log_exit(self, slot: Slot, code: int, was_loading: bool) -> None:
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        if (was_loading or slot.last_failure) and not self.stopping:  # or said FAILED once ready
            slot.failures += 1
            delay = self.config.backoff_s(slot.failures)
            slot.not_before = time.monotonic() + delay
            reason = slot.last_failure or "died before it was ready (see its log)"
            log.warning(
                "slot_crashed",
                slot=slot.index,
                pid=slot.pid,
                how=how,
                reason=reason,
                failures=slot.failures,
                backoff_s=delay,
            )
            self._keep_failure(slot, how, reason, delay)
        else:
            reason = slot.retire_reason or ("stop" if self.stopping else how)
            log.info(
                "slot_exited",
                slot=slot.index,
                pid=slot.pid,
                worker=slot.worker_name,
                how=how,
                reason=reason,
            )
        slot.last_failure = ""

    def _keep_failure(self, slot: Slot, how: str, reason: str, delay: float) -> None:
        """Beside the worker's own record: how it ended and when the slot starts again."""
        try:
            record_backoff(
                self._connection,
                host=socket.gethostname(),
                slot=str(slot.index),
                how=how,
                reason=reason,
                failures=slot.failures,
                backoff_s=delay,
                ttl_s=self.settings.start_failure_ttl_s,
            )
        except redis.RedisError as e:
            log.warning("pool_redis_error", duty="record_start_failure", error=str(e))

    def _release_jobs_of(self, slot: Slot) -> None:
        """A worker that died holding a job: release the job now rather than after its TTL."""
        if not slot.worker_name:
            return
        try:
            self._reaper.reap(dead_worker=slot.worker_name)
            forget_worker(self._connection, slot.worker_name)
        except redis.RedisError as e:
            log.warning("pool_redis_error", duty="release_jobs", error=str(e))

    def _reap_periodically(self) -> None:
        now = time.monotonic()
        if now < self._next_reap:
            return
        self._next_reap = now + self.settings.heartbeat_interval_s
        try:
            if follow_master(self._connection):
                log.warning("redis_master_changed", pid=os.getpid())
            self._reaper.reap()
        except redis.RedisError as e:
            log.warning("pool_redis_error", duty="reap", error=str(e))

    # -- signals -----------------------------------------------------------------------------

    def _install_signals(self) -> None:
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wake select on exits

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """First: warm shutdown of every slot; second: forwarded too (workers then stop now)."""
        self.signals_received += 1
        mode = "warm" if self.signals_received == 1 else "cold"
        log.info("pool_stopping", signal=signal.Signals(signum).name, mode=mode)
        for slot in self._live_slots():
            assert slot.process is not None
            slot.process.send_signal(signal.SIGTERM)
            slot.state = SlotState.STOPPING

    def _close_fds(self) -> None:
        signal.set_wakeup_fd(-1)
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        for slot in self.slots:
            if slot.control_fd is not None:
                os.close(slot.control_fd)
                slot.control_fd = None
