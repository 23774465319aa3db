"""No secret anywhere a deployment shows one: a front (`cosyq serve`, its webhook dispatcher in
it, one setting from a .env file) and a worker pool run at DEBUG against a Redis that needs an ACL
password, with API, operator, S3 and signing keys set; every log line, every HTTP answer, every
webhook, every command's output, the processes' titles and every value in Redis are searched
for each secret (README: Configuration)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import free_port
from tests.doubles.harness import Cluster, wait_for
from tests.doubles.redis_servers import ACL_USERS, SecuredRedis, secured_redis
from tests.doubles.webhook_receiver import Receiver, webhook_receiver
from tests.integration.producer.http.conftest import Front, front_env, start_front

REDIS_PASSWORD = ACL_USERS["alice"][0]  # "s3cret pass", in the URL as s3cret%20pass
API_KEY = "tenant-key-Hq7Vd2Lw9Xc4"
OPERATOR_KEY = "operator-key-Zt5Mb8Ke3Rn6"  # from the front's .env file
S3_KEY_ID = "AKIA-SWEPT-ID-4PQ"
S3_SECRET = "s3-swept-secret-8JW"
SIGNING_KEY = "c3dlcHQtc2lnbmluZy1zZWNyZXQtMzItYnl0ZXMhIQ=="
SECRETS = (REDIS_PASSWORD, "s3cret%20pass", API_KEY, OPERATOR_KEY, S3_KEY_ID, S3_SECRET)
SECRETS += (SIGNING_KEY, SIGNING_KEY.rstrip("="))
HOOK_TOKEN = "hook-token-Wc8Nf2"  # the tenant's receiver's, in its webhook URL's query


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredRedis]:
    with secured_redis(tmp_path) as server:
        yield server


def secret_settings(receiver: Receiver) -> dict[str, str]:
    return {
        "COSYQ_LOG_LEVEL": "DEBUG",
        "COSYQ_API_KEYS": f"acme:{API_KEY}",
        "COSYQ_S3_ACCESS_KEY_ID": S3_KEY_ID,
        "COSYQ_S3_SECRET_ACCESS_KEY": S3_SECRET,
        "COSYQ_WEBHOOK_SECRET": "whsec_" + SIGNING_KEY,
        "COSYQ_WEBHOOK_ALLOWED_URLS": receiver.url,
        "COSYQ_WEBHOOK_ALLOW_PRIVATE": "1",
        "COSYQ_WEBHOOK_POLL_S": "0.1",
    }


def test_no_secret_in_logs_answers_webhooks_commands_or_redis(
    secured: SecuredRedis, tmp_path: Path
) -> None:
    url = secured.url("alice", REDIS_PASSWORD)
    with webhook_receiver() as receiver:
        extra = secret_settings(receiver)
        (tmp_path / "front").mkdir()
        (tmp_path / "front" / ".env").write_text(f"COSYQ_OPERATOR_KEYS={OPERATOR_KEY}\n")
        front = start_front(tmp_path / "front", url, **extra, COSYQ_WEBHOOK_DISPATCH_IN_SERVE="1")
        cluster = Cluster(redis_url=url, root=tmp_path, overrides=extra)
        cluster.overrides["COSYQ_OPERATOR_KEYS"] = OPERATOR_KEY
        port = free_port()
        cluster.start("pool", "-n", "1", log_name="worker.log", COSYQ_METRICS_PORT=str(port))
        try:
            shown, session = exercise_front(front, receiver)
            shown += _shown(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10))
            commands = run_commands(front, extra)
            shown += commands + process_titles(front, cluster)
        finally:
            front.stop()
            cluster.stop_all()
    logs = front.log.read_text() + (tmp_path / "worker.log").read_text()
    shown += logs + redis_contents(secured.admin())
    for secret in SECRETS:
        assert secret not in shown, (secret, _around(shown, secret))
    assert session.split("=", 1)[1] not in logs + redis_contents(secured.admin())
    assert HOOK_TOKEN not in logs + commands  # sent to its receiver, never shown


def exercise_front(front: Front, receiver: Receiver) -> tuple[str, str]:
    """What a client, an operator, a browser and a webhook receiver see; the session cookie."""
    answers: list[httpx.Response] = []
    hook = {"url": receiver.url + f"/hook?token={HOOK_TOKEN}"}
    with front.http(API_KEY) as tenant, front.http(OPERATOR_KEY) as operator:
        job = tenant.post("/v1/jobs", json={"text": "Swept line.", "webhook": hook})
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        wait_for(lambda: tenant.get(f"/v1/jobs/{job_id}").json()["state"] == "finished", 60, "job")
        wait_for(lambda: len(receiver.calls) >= 1, 30, "the webhook")
        answers += [tenant.get(f"/v1/jobs/{job_id}"), operator.get("/metrics")]
        answers += [tenant.post("/v1/jobs", json={"text": "x", "speed": "fast", "webhook": hook})]
        answers += [tenant.get("/openapi.json"), tenant.get("/readyz"), tenant.get("/healthz")]
        answers += [tenant.get(f"/v1/jobs/{job_id}?api_key={API_KEY}&token={OPERATOR_KEY}")]
    with httpx.Client(base_url=front.url, timeout=30) as browser:
        answers += [browser.post("/ui/signin", data={"key": API_KEY + "x"})]
        signed = browser.post("/ui/signin", data={"key": OPERATOR_KEY, "name": "ops"})
        session = signed.headers["set-cookie"].split(";", 1)[0]
        pages = ("/ui", "/ui/jobs", "/ui/suspects", "/ui/documents")
        answers += [browser.get(page, headers={"Cookie": session}) for page in pages]
        answers += [browser.get("/metrics", headers={"Authorization": f"Basic {API_KEY}"})]
    calls = [f"{call.path} {call.headers} {call.body}" for call in receiver.calls]
    return "\n".join([*map(_shown, answers), signed.text, *calls]), session


def run_commands(front: Front, extra: dict[str, str]) -> str:
    env = front_env(front.redis_url, front.storage, **extra)
    commands = (["status"], ["failed"], ["webhooks", "failed"], ["voices", "list"])
    done = [
        subprocess.run(
            [sys.executable, "-m", "producer.cli", *command],
            env=env,
            cwd=front.storage,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        for command in commands
    ]
    return "\n".join(f"{run.args} {run.returncode} {run.stdout} {run.stderr}" for run in done)


def process_titles(front: Front, cluster: Cluster) -> str:
    """`ps`'s view (the command line and title) of the front, the worker and their children."""
    pids = {front.process.pid, *(process.pid for process in cluster.processes)}
    found = subprocess.run(
        ["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True, check=True
    )
    lines = found.stdout.splitlines()
    children = {line.split()[0] for line in lines[1:] if int(line.split()[1]) in pids}
    return "\n".join(line for line in lines if line.split()[0] in {*map(str, pids), *children})


def redis_contents(admin: redis.Redis) -> str:
    """Every key and value in every database, RQ's compressed job data unpacked."""
    found: list[str] = []
    for db in range(16):
        connection = admin if db == 0 else _db(admin, db)
        for key in connection.scan_iter(count=500):
            found += [_text(key), *map(_text, _values(connection, key))]
    return "\n".join(found)


def _db(admin: redis.Redis, db: int) -> redis.Redis:
    kwargs = admin.connection_pool.connection_kwargs
    return redis.Redis(host=kwargs["host"], port=kwargs["port"], password=kwargs["password"], db=db)


def _values(connection: redis.Redis, key: bytes) -> list[bytes]:
    kind = connection.type(key).decode()
    if kind == "string":
        return [connection.get(key) or b""]
    if kind == "hash":
        return [v for pair in connection.hgetall(key).items() for v in pair]
    if kind == "list":
        return list(connection.lrange(key, 0, -1))
    if kind == "set":
        return list(connection.smembers(key))
    if kind == "zset":
        return list(connection.zrange(key, 0, -1))
    if kind == "stream":
        return [v for _, fields in connection.xrange(key) for pair in fields.items() for v in pair]
    return []


def _text(value: bytes) -> str:
    with contextlib.suppress(zlib.error):
        value = zlib.decompress(value)
    return value.decode("utf-8", "replace")


def _shown(response: httpx.Response) -> str:
    return f"{response.request.url.path} {response.status_code} {response.headers} {response.text}"


def _around(text: str, secret: str) -> str:
    at = text.index(secret)
    return text[max(0, at - 300) : at + 100]
