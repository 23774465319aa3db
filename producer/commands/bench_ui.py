"""`cosyq bench ui [--jobs 10000] [--rounds 30] [--json]`: how fast the /ui pages answer with
many jobs kept in Redis (issue 49's target: a page load under 300 ms with 10,000 jobs).

It fills an EMPTY Redis database (COSYQ_REDIS_URL; refused otherwise, so it never mixes its
jobs into real ones) with finished jobs as the producer and the worker leave them (RQ job hashes,
the finished and failed registries, the /ui indexes; a tenth suspect, a twentieth failed), runs
`cosyq serve`'s app in-process under uvicorn on a free loopback port with an operator key, and
times each page over real HTTP; then empties the database again. Prints the CPU, the load and a
table of p50/p95/max per page.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from shared import keys
from shared.errors import SettingsError
from shared.job_index import Outcome, index_jobs, record_outcome
from shared.plurals import counted
from shared.settings import Settings
from shared.tenants import TENANT_META_KEY

if TYPE_CHECKING:
    from producer.cli import CliContext

TARGET_MS = 300.0
PAGES = (
    ("fleet", "/ui"),
    ("jobs (first page)", "/ui/jobs"),
    ("jobs (offset 5,000)", "/ui/jobs?offset=5000"),
    ("jobs (verdict suspect)", "/ui/jobs?verdict=suspect"),
    ("jobs (state failed)", "/ui/jobs?state=failed"),
    ("one job", "/ui/jobs/{job}"),
)


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks of the producer side")
    kinds = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    ui = kinds.add_parser("ui", help="/ui page loads with many jobs in Redis (empty database)")
    ui.add_argument("--jobs", type=int, default=10_000, help="finished jobs to fill (10000)")
    ui.add_argument("--rounds", type=int, default=30, help="loads of each page (30)")
    ui.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    ui.set_defaults(handler=run_bench_ui)


def run_bench_ui(args: argparse.Namespace, context: CliContext) -> int:
    from producer.client import CosyqClient  # noqa: PLC0415

    if args.jobs < 1 or args.rounds < 1:
        raise SettingsError("--jobs and --rounds: at least 1")
    operator = secrets.token_urlsafe(24)
    settings = context.settings.model_copy(update={"operator_keys": SecretStr(operator)})
    with CosyqClient(settings) as client:
        connection = client.connection
        if connection.dbsize():
            raise SettingsError(
                "cosyq bench ui fills and then empties its database: point COSYQ_REDIS_URL at "
                "an empty one (e.g. redis://127.0.0.1:6379/15)"
            )
        try:
            first = fill(connection, settings, args.jobs)
            timings = measure(settings, operator, first, args.rounds)
        finally:
            connection.flushdb()  # it was empty: everything in it is ours
    report = _report(timings, args.jobs)
    if args.json:
        context.out.print(json.dumps(report), markup=False)
    else:
        _print_table(context, report)
    return 0 if all(row["p95_ms"] < TARGET_MS for row in report["pages"]) else 1


def fill(connection: Any, settings: Settings, count: int) -> str:
    """`count` finished jobs of tenant default (newest last); the newest job's id."""
    from rq.job import Job, JobStatus  # noqa: PLC0415
    from rq.serializers import JSONSerializer  # noqa: PLC0415

    now, keep = time.time(), settings.result_ttl_s
    job_id = ""
    for start in range(0, count, 1000):
        with connection.pipeline(transaction=False) as pipe:
            ids = []
            for n in range(start, min(count, start + 1000)):
                job_id = uuid.uuid4().hex
                failed = n % 20 == 7
                meta = {TENANT_META_KEY: "default", keys.SUBMIT_META_KEY: {"voice": "bench"}}
                if failed:
                    meta[keys.ERROR_META_KEY] = {"kind": "transient", "message": "bench"}
                job = Job.create(
                    keys.SYNTHESIZE_FUNCTION,
                    kwargs={"request": {"text": f"Bench sentence number {n}."}},
                    connection=connection,
                    serializer=JSONSerializer,
                    id=job_id,
                    origin=keys.QUEUE_DEFAULT,
                    meta=meta,
                    status=JobStatus.FAILED if failed else JobStatus.FINISHED,
                )
                job.save(pipeline=pipe)
                registry = "rq:failed:" if failed else "rq:finished:"
                pipe.zadd(registry + keys.QUEUE_DEFAULT, {job_id: now + keep})
                ids.append(job_id)
            index_jobs(pipe, "default", ids, keep_s=keep, at=now - (count - start) / 10)
            pipe.execute()
        for n, done in enumerate(ids):
            if (start + n) % 20 != 7:
                verdict = "suspect" if (start + n) % 10 == 3 else "ok"
                record_outcome(connection, Outcome(done, "default", 2.0, verdict, keep))
    return job_id


def measure(settings: Settings, operator: str, job_id: str, rounds: int) -> dict[str, list[float]]:
    """Each page loaded `rounds` times over HTTP (after one warm-up load); ms per load."""
    import httpx  # noqa: PLC0415
    import uvicorn  # noqa: PLC0415

    from producer.http.app import create_app  # noqa: PLC0415

    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    timings: dict[str, list[float]] = {}
    try:
        while not server.started:
            time.sleep(0.05)
        headers = {"Authorization": f"Bearer {operator}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as http:
            for name, path in PAGES:
                url = path.format(job=job_id)
                http.get(url).raise_for_status()
                timings[name] = [_timed(http, url) for _ in range(rounds)]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    return timings


def _timed(http: Any, url: str) -> float:
    started = time.perf_counter()
    http.get(url).raise_for_status()
    return (time.perf_counter() - started) * 1000


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _report(timings: dict[str, list[float]], jobs: int) -> dict[str, Any]:
    model, flags = _cpu()
    rows = [
        {
            "page": name,
            "p50_ms": round(statistics.median(values), 1),
            "p95_ms": round(sorted(values)[max(0, int(len(values) * 0.95) - 1)], 1),
            "max_ms": round(max(values), 1),
        }
        for name, values in timings.items()
    ]
    load = os.getloadavg()
    return {"jobs": jobs, "cpu": model, "isa": flags, "load": load, "pages": rows}


def _cpu() -> tuple[str, list[str]]:
    """The CPU's model name and its vector ISA flags (Linux /proc/cpuinfo; else unknown)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown", []
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags":
            flags.update(value.split())
    wanted = ("avx", "avx2", "avx512f", "avx512_bf16", "amx_tile", "fma", "neon")
    return model or "unknown", [flag for flag in wanted if flag in flags]


def _print_table(context: CliContext, report: dict[str, Any]) -> None:
    from rich.table import Table  # noqa: PLC0415

    load = ", ".join(f"{value:.2f}" for value in report["load"])
    context.out.print(f"CPU: {report['cpu']}  ISA: {' '.join(report['isa'])}", markup=False)
    context.out.print(
        f"load average: {load}; {counted(report['jobs'], 'job')} in Redis", markup=False
    )
    table = Table(title=f"/ui page loads (target p95 < {TARGET_MS:.0f} ms)")
    for column in ("page", "p50 ms", "p95 ms", "max ms"):
        table.add_column(column, justify="left" if column == "page" else "right")
    for row in report["pages"]:
        table.add_row(row["page"], *(f"{row[k]:.1f}" for k in ("p50_ms", "p95_ms", "max_ms")))
    context.out.print(table)
