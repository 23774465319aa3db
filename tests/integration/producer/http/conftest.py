"""The HTTP front for real: `cosyq serve` (uvicorn) on a free port, the session's redis-server,
and a worker pool on the tiny model.

Three fronts, each its own process:
- `live`: keys on, one tiny-model worker behind it (a Redis database of its own);
- `stalled`: no worker at all, a queue depth of 2 and a 1 s wait (429, 504, /readyz 503);
- `dead`: its Redis is a port nobody listens on (503).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from shared.keys import QUEUE_LOW, SYNTHESIZE_FUNCTION
from shared.settings import Settings
from shared.tenants import DEFAULT_TENANT, TENANT_META_KEY
from tests.conftest import RedisServer, free_port
from tests.doubles.harness import REPO_ROOT, Cluster, read_events, wait_for

API_KEY = "test-key-" + "7" * 24
# One Redis database per module-scoped front of this folder, never shared: two fronts whose
# modules ran one after the other in a test process once shared a database, and the first
# one's worker, stopping, took the second one's job. 0 is the `redis_url` fixture's.
DATABASES = {
    "live": 3,
    "stalled": 4,
    "openapi": 5,
    "boundary": 6,
    "scope": 7,
    "ui": 8,
    "s3": 9,
    "metrics": 10,
    "auth": 11,
    "readback": 12,
    "unkeyed": 13,
    "oracles": 14,
    "crash": 15,
}
assert len(set(DATABASES.values())) == len(DATABASES)
START_TIMEOUT_S = 30.0
POOL_READY_TIMEOUT_S = 90.0


@dataclass
class Front:
    url: str
    redis_url: str
    storage: Path
    log: Path
    process: subprocess.Popen[bytes]

    def http(self, key: str | None = API_KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60.0)

    def events(self) -> list[dict]:
        return read_events(self.log)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def front_env(redis_url: str, storage: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    env.update(
        PYTHONPATH=str(REPO_ROOT),
        PYTHONUNBUFFERED="1",
        COSYQ_REDIS_URL=redis_url,
        COSYQ_STORAGE_URL=storage.as_uri(),
        COSYQ_LOG_FORMAT="json",
        COSYQ_MAX_RETRIES="0",
        COSYQ_REDIS_CONNECT_TIMEOUT_S="2",
    )
    env.update(extra)
    return env


def start_front(root: Path, redis_url: str, *args: str, **extra: str) -> Front:
    """`python -m producer.cli serve ARGS` on a free port; returns once /healthz answers."""
    root.mkdir(parents=True, exist_ok=True)
    storage = root / "storage"
    storage.mkdir(exist_ok=True)
    port = free_port()
    log = root / "front.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "producer.cli", "serve", "--port", str(port), *args],
            cwd=root,  # no stray .env
            env=front_env(redis_url, storage, **extra),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    front = Front(f"http://127.0.0.1:{port}", redis_url, storage, log, process)

    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"cosyq serve exited {process.returncode}:\n{log.read_text()}")
        try:
            return httpx.get(front.url + "/healthz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, START_TIMEOUT_S, "cosyq serve to answer /healthz", interval=0.2)
    return front


def queued_job(connection: redis.Redis, request: dict[str, Any], **options: Any) -> str:
    """A synthesize job queued as a producer queues one for the tenant "default" (tagged: a
    job without its tenant tag is nobody's), on the low queue; `options` go to RQ's enqueue."""
    queue = Queue(QUEUE_LOW, connection=connection, serializer=JSONSerializer)
    meta = {TENANT_META_KEY: DEFAULT_TENANT}
    return str(queue.enqueue(SYNTHESIZE_FUNCTION, request=request, meta=meta, **options).id)


def fresh_db(server: RedisServer, name: str) -> str:
    """The flushed database of the front `name` (DATABASES) on our own server."""
    url = server.url.rsplit("/", 1)[0] + f"/{DATABASES[name]}"
    redis.Redis.from_url(url).flushdb()
    return url


def submitted_id(response: httpx.Response) -> str:
    """The id of a 202 answer (the body shown when it is not one)."""
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def stop_front_and_pool(front: Front, pool: subprocess.Popen[bytes], cluster: Cluster) -> None:
    """A module's front, then its pool (SIGTERM: a clean stop), then anything left."""
    front.stop()
    pool.send_signal(signal.SIGTERM)
    try:
        pool.wait(timeout=60)
    finally:
        cluster.stop_all()


@pytest.fixture(scope="session")
def live(
    redis_server: RedisServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Front]:
    """Keys on; one tiny-model worker (real engine) behind it; /readyz 200 before tests run.

    One for the test process, not one per file (a front and a model load each, ~5 s): its
    tests submit their own jobs and read back only those, never the database's totals."""
    root = tmp_path_factory.mktemp("http-live")
    url = fresh_db(redis_server, "live")
    front = start_front(root / "front", url, COSYQ_API_KEYS=f"other-key,{API_KEY}")
    cluster = start_tiny_pool(root, front, tiny_model_dir)
    try:
        yield front
    finally:
        front.stop()
        cluster.stop_all()


def start_tiny_pool(root: Path, front: Front, tiny_model_dir: Path, **extra: str) -> Cluster:
    """One tiny-model worker (the real engine) on the front's Redis and storage; returns once
    the front's /readyz says a worker is ready. `extra`: more COSYQ_* for the pool."""
    cluster = Cluster(
        redis_url=front.redis_url,
        root=root,
        overrides={
            "COSYQ_ENGINE": str(Settings.model_fields["engine"].default),  # the real engine
            "COSYQ_MODEL_DIR": str(tiny_model_dir),
            "COSYQ_DEVICE": "cpu",
            "COSYQ_THREADS": "1",
            "COSYQ_HASH_CACHE_DIR": str(root / "hashes"),
            "COSYQ_STORAGE_URL": front.storage.as_uri(),
            "COSYQ_MAX_RETRIES": "0",
            **extra,
        },
    )
    cluster.start("pool", "-n", "1", log_name="pool.log")
    try:
        with httpx.Client(base_url=front.url, timeout=10.0) as client:
            wait_for(
                lambda: client.get("/readyz").status_code == 200,
                POOL_READY_TIMEOUT_S,
                "a ready worker behind /readyz",
                interval=0.5,
            )
    except BaseException:
        cluster.stop_all()
        raise
    return cluster


@pytest.fixture(scope="module")
def stalled(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    """No worker, queue depth 2, speech waits 1 s; small upload cap; no keys (loopback)."""
    root = tmp_path_factory.mktemp("http-stalled")
    front = start_front(
        root,
        fresh_db(redis_server, "stalled"),
        COSYQ_MAX_QUEUE_DEPTH="2",
        COSYQ_HTTP_WAIT_TIMEOUT_S="1",
        COSYQ_HTTP_RETRY_AFTER_S="7",
        COSYQ_HTTP_MAX_UPLOAD_BYTES="50000",
    )
    yield front
    front.stop()


@pytest.fixture(scope="module")
def dead(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    """Its Redis is a free port: nothing listens there."""
    root = tmp_path_factory.mktemp("http-dead")
    front = start_front(root, f"redis://127.0.0.1:{free_port()}/0")
    yield front
    front.stop()
