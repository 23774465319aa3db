"""`cosyq-worker run` and `cosyq-worker pool`: one recycling worker, or K of them.

Nothing here imports torch: the engine is imported by the worker when it loads the model.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import redis

from shared.connection import check_redis, redis_connection, settings_error
from shared.errors import CosyqError, SettingsError, TransientError
from shared.eviction import warn_if_evicting
from shared.logs import configure_logging, get_logger
from shared.settings import Settings, load_settings
from workers.service import control, metrics
from workers.service.cache_folders import check_worker_folders
from workers.service.metrics import MetricsServer
from workers.service.outage import RedisRefusedError
from workers.service.pool import Pool, PoolConfig

if TYPE_CHECKING:
    from workers.worker import CosyqWorker

EXIT_START_FAILED = 2  # bad settings, no model, Rosetta refused, Redis refused us: fix, restart

log = get_logger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = subparsers.add_parser(
        "run",
        help="one worker: load the model, take jobs until recycled",
        description="Load the engine once, warm it up, then take jobs from the queues (default: "
        "cosyq-high cosyq-default cosyq-low) until a recycling limit; exit 0 to be restarted.",
    )
    run.add_argument("queues", nargs="*", metavar="QUEUE", help="queues, highest priority first")
    run.add_argument("--burst", action="store_true", help="exit when the queues are empty")
    run.add_argument("--max-jobs", type=int, help="also stop after N jobs (RQ's own counter)")
    run.add_argument("--name", help="worker name (default host.pid.random)")
    run.add_argument("--slot", type=int, help=argparse.SUPPRESS)  # set by the pool
    run.add_argument("--control-fd", type=int, help=argparse.SUPPRESS)  # set by the pool
    run.set_defaults(handler=run_worker)

    pool = subparsers.add_parser(
        "pool",
        help="K workers as fresh processes, restarted when they exit, loading one at a time",
        description="Start K workers (each a fresh interpreter, or with COSYQ_POOL_START=template "
        "on Linux a fork of one template process that imported the worker's modules), restart "
        "any that exit, let at most one slot load at a time, back off on crash loops, and "
        "forward SIGTERM/SIGINT as a warm shutdown.",
    )
    pool.add_argument("-n", "--workers", type=int, help="number of slots K (COSYQ_POOL_SIZE)")
    pool.add_argument("queues", nargs="*", metavar="QUEUE", help="queues, highest priority first")
    pool.add_argument(
        "--backoff-initial", type=float, default=PoolConfig.backoff_initial_s, help="seconds"
    )
    pool.add_argument("--backoff-max", type=float, default=PoolConfig.backoff_max_s, help="seconds")
    pool.set_defaults(handler=run_pool)


def run_worker(args: argparse.Namespace) -> int:
    # The worker's modules here, not at the top: `pool` (an exec'd pool under each pool test)
    # and `--help` never run one (0.1 CPU s of their start); the templates import it anyway.
    from workers.worker import CosyqWorker  # noqa: PLC0415

    settings: Settings | None = None
    try:
        settings = load_settings()
        check_worker_folders(settings)  # before Redis, storage and the model: one line, exit 2
        configure_logging(settings)
        worker = CosyqWorker(
            args.queues,
            name=args.name,
            connection=redis_connection(settings),
            settings=settings,
            control_fd=args.control_fd,
            slot=args.slot,
        )
        server = _serve_worker_metrics(worker, settings) if args.control_fd is None else None
        try:
            worker.work(burst=args.burst, max_jobs=args.max_jobs, logging_level=settings.log_level)
        finally:
            if server is not None:
                server.close()
    except CosyqError as e:
        print(f"cosyq-worker: {e}", file=sys.stderr)
        return EXIT_START_FAILED
    except (redis.RedisError, RedisRefusedError) as e:
        error = e.error if isinstance(e, RedisRefusedError) else e
        problem = settings_error(error, settings) if settings is not None else None
        if problem is None:
            raise
        return _refused_by_redis(problem, args.control_fd)
    return 0


def _refused_by_redis(problem: SettingsError, control_fd: int | None) -> int:
    """Wrong password, ACL or TLS certificate: one line, tell the pool, exit non-zero."""
    log.error("redis_refused_worker", error=str(problem))
    if control_fd is not None:
        control.ControlChannel(control_fd).send(control.FAILED, str(problem))
    print(f"cosyq-worker: {problem}", file=sys.stderr)
    return EXIT_START_FAILED


def _serve_worker_metrics(worker: CosyqWorker, settings: Settings) -> MetricsServer | None:
    """A lone worker serves its own /metrics (under a pool, the pool serves them all)."""
    if settings.metrics_port is None:
        return None
    registry = metrics.worker_registry(settings, worker.queue_names())
    return metrics.serve(registry, settings.metrics_host, settings.metrics_port)


def run_pool(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
        check_worker_folders(settings)  # its workers would each fail on it, backing off
    except CosyqError as e:
        print(f"cosyq-worker: {e}", file=sys.stderr)
        return EXIT_START_FAILED
    size = args.workers if args.workers is not None else settings.pool_size
    if size < 1:
        print("cosyq-worker pool: -n must be at least 1", file=sys.stderr)
        return EXIT_START_FAILED
    configure_logging(settings)
    try:
        with redis_connection(settings) as connection:
            check_redis(connection, settings)
            warn_if_evicting(connection, "pool")
    except SettingsError as e:
        print(f"cosyq-worker pool: {e}", file=sys.stderr)
        return EXIT_START_FAILED
    except TransientError as e:
        log.warning("pool_redis_unreachable", error=str(e))  # the workers wait for it
    config = PoolConfig(
        size=size,
        queues=tuple(args.queues),
        backoff_initial_s=args.backoff_initial,
        backoff_max_s=args.backoff_max,
    )
    try:
        return Pool(config, settings).run()
    except CosyqError as e:  # e.g. the metrics port cannot be bound
        print(f"cosyq-worker: {e}", file=sys.stderr)
        return EXIT_START_FAILED
