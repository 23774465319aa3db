"""`cosyq-worker bench queue --via http`: what the HTTP front costs next to a direct submit.

On a private redis-server, with `cosyq serve` on a free loopback port:
1. submit only (no worker running): `CosyqClient.submit` against `POST /v1/jobs`, one at a
   time, and `POST /v1/jobs` from several client threads at once (requests/s);
2. end to end, one job at a time with one worker (`cosyq-worker run`, the configured engine):
   `submit` + `result` against `POST /v1/audio/speech` (which also reads the audio back).
   Each job's own time (RQ's enqueued_at -> ended_at) is taken out of the wall time; what is
   left is the cost outside the job, and the front's added latency is the difference of the two
   medians.
The HTTP client is the standard library's (one keep-alive connection per thread), so the bench
needs no HTTP package on the worker side; the server needs cosyq[http].
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median, quantiles
from typing import Any

import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from producer.client import CosyqClient
from shared.settings import load_settings
from workers.tools.bench.queue import BENCH_TEXT, tiny_model_dir, worker_env
from workers.tools.local_redis import LocalRedis, free_port

START_TIMEOUT_S = 120.0
JOB_WAIT_S = 600.0  # one measured job may take this long (both paths)
SPEECH = {"model": "cosyvoice2", "input": BENCH_TEXT, "voice": "default", "response_format": "wav"}


@dataclass(frozen=True)
class Series:
    """Per-call milliseconds of one measured series."""

    label: str
    ms: list[float]
    span_s: float  # wall time of the whole series (for calls/s)

    @property
    def per_s(self) -> float:
        return len(self.ms) / self.span_s if self.span_s > 0 else 0.0

    @property
    def median_ms(self) -> float:
        return median(self.ms)

    @property
    def p90_ms(self) -> float:
        return quantiles(self.ms, n=10)[-1] if len(self.ms) >= 2 else self.ms[0]


@dataclass(frozen=True)
class EndToEnd:
    label: str
    wall: Series
    job_ms: list[float]  # RQ enqueued_at -> ended_at of each job

    @property
    def outside_ms(self) -> float:
        return median(w - j for w, j in zip(self.wall.ms, self.job_ms, strict=True))


@dataclass(frozen=True)
class HttpBench:
    engine: str
    concurrency: int
    submit_direct: Series
    submit_http: Series
    submit_http_concurrent: Series
    direct: EndToEnd
    via_http: EndToEnd
    load_average: tuple[float, float]

    @property
    def added_ms(self) -> float:
        return self.via_http.outside_ms - self.direct.outside_ms

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["added_ms"] = self.added_ms
        return doc


class Front:
    """`cosyq serve` in a child process, and a keep-alive connection per calling thread."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.port = free_port()
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "producer.cli", "serve", "--port", str(self.port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.log_path = log_path
        self._local = threading.local()

    def connection(self) -> http.client.HTTPConnection:
        if not hasattr(self._local, "conn"):
            self._local.conn = http.client.HTTPConnection(
                "127.0.0.1", self.port, timeout=JOB_WAIT_S + 30
            )
        conn: http.client.HTTPConnection = self._local.conn
        return conn

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], bytes]:
        """One request; a keep-alive connection the server closed while idle is reopened once."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in (1, 2):
            conn = self.connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                return (
                    response.status,
                    {k.lower(): v for k, v in response.getheaders()},
                    (response.read()),
                )
            except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                conn.close()
                del self._local.conn
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def wait(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"cosyq serve exited {self.process.returncode}:\n{tail}")
            try:
                if self.call("GET", path)[0] == 200:
                    return
            except OSError:
                self._local = threading.local()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no 200 from {path} after {timeout:g} s")
            time.sleep(0.25)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)


def timed(label: str, n: int, call: Callable[[int], None]) -> Series:
    ms = []
    started = time.perf_counter()
    for index in range(n):
        t0 = time.perf_counter()
        call(index)
        ms.append(1000 * (time.perf_counter() - t0))
    return Series(label, ms, time.perf_counter() - started)


def concurrent(label: str, n: int, threads: int, call: Callable[[int], None]) -> Series:
    ms: list[float] = []
    lock = threading.Lock()

    def worker(first: int) -> None:
        for index in range(first, n, threads):
            t0 = time.perf_counter()
            call(index)
            with lock:
                ms.append(1000 * (time.perf_counter() - t0))

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    started = time.perf_counter()
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return Series(label, ms, time.perf_counter() - started)


def _expect(status: int, want: int, body: bytes) -> None:
    if status != want:
        raise RuntimeError(f"HTTP {status} (wanted {want}): {body[:300]!r}")


def _job_ms(connection: redis.Redis, job_ids: list[str]) -> list[float]:
    jobs = Job.fetch_many(job_ids, connection, JSONSerializer)
    out = []
    for job in jobs:
        if job is None or job.enqueued_at is None or job.ended_at is None:
            raise RuntimeError("a measured job has no timestamps (expired?)")
        out.append(1000 * (job.ended_at - job.enqueued_at).total_seconds())
    return out


def run(
    engine: str, model_dir: Path | None, jobs: int, e2e_jobs: int, concurrency: int
) -> HttpBench:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="cosyq-bench-http-") as temp:
        workdir = Path(temp)
        with LocalRedis(workdir / "redis") as server:
            prompt_dir = model_dir or tiny_model_dir(workdir / "model")
            env = worker_env(
                server.url, engine, prompt_dir, workdir / "out", 2 * e2e_jobs + 10
            )  # no recycling
            env.update(
                COSYQ_MAX_RETRIES="0",
                COSYQ_MAX_QUEUE_DEPTH=str(jobs * 4 + 100),
                COSYQ_HTTP_WAIT_TIMEOUT_S=str(JOB_WAIT_S),  # a slow (shared) host: no 504
            )
            env.pop("COSYQ_API_KEYS", None)  # loopback only
            settings = load_settings(env_file=None, **_settings_from(env))
            connection = redis.Redis.from_url(server.url)
            front = Front(env, workdir / "front.log")
            client = CosyqClient(settings)
            try:
                front.wait("/healthz", START_TIMEOUT_S)
                submits = _submit_only(front, client, jobs, concurrency)
                connection.flushdb()  # none of those runs: the worker starts on an empty queue
                direct, via = _end_to_end(front, client, env, workdir, e2e_jobs)
                return HttpBench(
                    engine=engine,
                    concurrency=concurrency,
                    submit_direct=submits[0],
                    submit_http=submits[1],
                    submit_http_concurrent=submits[2],
                    direct=EndToEnd(
                        "CosyqClient submit + result", direct[0], _job_ms(connection, direct[1])
                    ),
                    via_http=EndToEnd("POST /v1/audio/speech", via[0], _job_ms(connection, via[1])),
                    load_average=(load_before, os.getloadavg()[0]),
                )
            finally:
                client.close()
                front.stop()
                connection.close()


def _submit_only(
    front: Front, client: CosyqClient, jobs: int, concurrency: int
) -> tuple[Series, Series, Series]:
    def direct(_: int) -> None:
        client.submit({"text": BENCH_TEXT})

    def via_http(_: int) -> None:
        status, _headers, body = front.call("POST", "/v1/jobs", {"text": BENCH_TEXT})
        _expect(status, 202, body)

    return (
        timed("CosyqClient.submit", jobs, direct),
        timed("POST /v1/jobs", jobs, via_http),
        concurrent(f"POST /v1/jobs, {concurrency} threads", jobs, concurrency, via_http),
    )


def _end_to_end(
    front: Front, client: CosyqClient, env: dict[str, str], workdir: Path, n: int
) -> tuple[tuple[Series, list[str]], tuple[Series, list[str]]]:
    """One worker; n jobs submit + result, then n speech requests; (series, job ids) each."""
    direct_ids: list[str] = []
    http_ids: list[str] = []

    def direct(_: int) -> None:
        job_id = client.submit({"text": BENCH_TEXT})
        client.result(job_id, timeout=JOB_WAIT_S)
        direct_ids.append(job_id)

    def speech(_: int) -> None:
        status, headers, body = front.call("POST", "/v1/audio/speech", SPEECH)
        _expect(status, 200, body)
        http_ids.append(headers["x-cosyq-job-id"])

    with (workdir / "worker.log").open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "run"], env=env, stdout=log, stderr=log
        )
    try:
        front.wait("/readyz", START_TIMEOUT_S)
        for index in range(2):  # warm both paths
            direct(index)
            speech(index)
        direct_ids.clear()
        http_ids.clear()
        return (timed("submit + result", n, direct), direct_ids), (
            timed("POST /v1/audio/speech", n, speech),
            http_ids,
        )
    finally:
        worker.terminate()
        worker.wait(timeout=60)


def _settings_from(env: dict[str, str]) -> dict[str, Any]:
    names = ("redis_url", "storage_url", "max_retries", "max_queue_depth")
    return {name: env[f"COSYQ_{name.upper()}"] for name in names}


def format_table(result: HttpBench) -> str:
    rows = [
        f"HTTP front benchmark: engine {result.engine}, private redis-server, cosyq serve on "
        f"loopback; load average {result.load_average[0]:.2f} -> {result.load_average[1]:.2f}",
        f"submit only (no worker), {len(result.submit_direct.ms)} calls each",
        f"  {'':34} {'calls/s':>8} {'median ms':>10} {'p90 ms':>8}",
    ]
    for series in (result.submit_direct, result.submit_http, result.submit_http_concurrent):
        rows.append(
            f"  {series.label:34} {series.per_s:8.1f} {series.median_ms:10.2f} {series.p90_ms:8.2f}"
        )
    rows.append(f"end to end, one job at a time, {len(result.direct.job_ms)} jobs each (medians)")
    rows.append(f"  {'':34} {'jobs/s':>8} {'wall ms':>10} {'job ms':>8} {'outside ms':>11}")
    for e2e in (result.direct, result.via_http):
        rows.append(
            f"  {e2e.label:34} {e2e.wall.per_s:8.2f} {e2e.wall.median_ms:10.2f} "
            f"{median(e2e.job_ms):8.2f} {e2e.outside_ms:11.2f}"
        )
    rows.append(
        f"outside the job: the front {result.via_http.outside_ms:.1f} ms, a direct submit + "
        f"result {result.direct.outside_ms:.1f} ms (difference {result.added_ms:+.1f} ms; "
        "CosyqClient.result polls, backing off to COSYQ_RESULT_POLL_INTERVAL_S, the front "
        "wakes on RQ's result stream); per submit the front adds "
        f"{result.submit_http.median_ms - result.submit_direct.median_ms:.2f} ms"
    )
    return "\n".join(rows)
