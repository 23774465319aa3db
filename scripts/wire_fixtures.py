"""Write one release's golden wire fixtures: every Redis key its producer and worker write.

Run with the release to record checked out (its code first on the path), e.g.

    git worktree add /tmp/cosyq-old <commit>
    cd /tmp/cosyq-old && PYTHONPATH=. python /path/to/scripts/wire_fixtures.py \\
        /path/to/tests/data/wire/<commit>

It starts a private redis-server, submits with the release's own client (the default tenant
and a named one): a speech job with an idempotency key and a webhook, a streamed job, a
document, a voice upload; dumps every key (`queued.json`), runs the release's own worker over
them with the scripted test engine (tests/doubles/engines.py) and dumps again, with the files it
stored (`finished.json`). tests/integration/upgrade/ loads both into a real Redis and runs the
current worker and client over them. Ids come from a counter (uuid4 is replaced), the storage
root is written `{storage}`; nothing here is a secret. Self-contained on purpose: it imports only
what every release has (the client, the worker, the local redis-server, the test engines).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import redis
import soundfile as sf
from wire_normalise import (
    EPOCH,
    Normaliser,
    group_position,
    stream_ids,
    ttl_bucket_ms,
)  # beside this script

FORMAT = 2  # of the files written here (tests/doubles/wire.py reads them)
STORAGE_URI, STORAGE_PATH = "{storage_uri}", "{storage_path}"
TENANT = "acme"
WEBHOOK = "http://127.0.0.1:9/hook"
SPEECH = {
    "text": "seconds:0.05 Hello from the previous release.",
    "seed": 7,
    "idempotency_key": "upgrade-speech",
    "metadata": {"order": 1234},
    "webhook": {"url": WEBHOOK},
    "output_key": "upgrade/speech.wav",
}
STREAMED = {"text": "seconds:0.05 A streamed job.", "stream": True, "seed": 3}
TENANT_SPEECH = {"text": "seconds:0.05 A tenant's job.", "idempotency_key": "upgrade-tenant"}
DOCUMENT = {
    "text": "seconds:0.05 The first paragraph of a document.\n\n"
    "seconds:0.05 Its second paragraph, a segment of its own.",
    "idempotency_key": "upgrade-document",
    "seed": 5,
}
VOICE = "upgrade-voice"
# started.json: the jobs workers are killed in ({marks}: the `once:` markers' folder)
KILLED = {
    "text": "seconds:0.05 A job its worker died in. once:{marks}/a kill",
    "seed": 11,
    "idempotency_key": "upgrade-killed",
    "webhook": {"url": WEBHOOK},
}
KILLED_DOCUMENT = {
    "text": "seconds:0.05 A document whose worker died in its segment. once:{marks}/d kill",
    "seed": 13,
}
KILLED_BATCH = {
    "batch_killed": {"text": "seconds:0.05 A batch's row that kills. once:{marks}/b kill"},
    "batch_held": {"text": "seconds:0.05 The batch's other row.", "webhook": {"url": WEBHOOK}},
}
HOST = socket.gethostname().split(".")[0]  # worker names start with it


def fixed_uuids(first: int = 1) -> None:
    """uuid4 from a counter: the same ids at each run of one release."""
    counter = iter(range(first, 1 << 62))
    uuid.uuid4 = lambda: uuid.UUID(int=(0xC0 << 120) | next(counter))  # type: ignore[assignment]


def fixed_wav_stamps() -> None:
    """libsndfile stamps a float WAV's PEAK chunk (a document's segment) with the time it was
    written: the release's encoder writes EPOCH there instead, in place (same bytes long)."""
    real = sf.write

    def write(file: Any, *args: Any, **kwargs: Any) -> None:
        real(file, *args, **kwargs)
        if isinstance(file, io.BytesIO):
            data = file.getbuffer()
            at = bytes(data).find(b"PEAK")
            if at >= 0:  # "PEAK", size, version, then the timestamp (uint32, little-endian)
                struct.pack_into("<I", data, at + 12, EPOCH)
            del data

    sf.write = write


def environment(root: Path, redis_url: str) -> None:
    for name in [n for n in os.environ if n.startswith("COSYQ_")]:
        del os.environ[name]
    model = root / "model"
    model.mkdir()
    sf.write(model / "prompt.wav", tone(24000, 1.0), 24000)
    (model / "prompt.txt").write_text("a test prompt", encoding="utf-8")
    os.environ.update(
        COSYQ_REDIS_URL=redis_url,
        COSYQ_ENGINE="tests.doubles.engines:fast",
        COSYQ_MODEL_DIR=str(model),
        COSYQ_STORAGE_URL=(root / "out").as_uri(),
        COSYQ_TENANTS=TENANT,
        COSYQ_WEBHOOK_ALLOWED_URLS="http://127.0.0.1:9/",
        COSYQ_WEBHOOK_ALLOW_PRIVATE="true",
        COSYQ_RETRY_BACKOFF_S="0",
        COSYQ_QUALITY_IMPORT_AT_START="false",
        COSYQ_LOG_LEVEL="warning",
    )


def tone(rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds), dtype=np.float32) / rate
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * np.pi * 200 * t) + 0.01 * rng.standard_normal(t.size)).astype(
        np.float32
    )


def submit(settings: Any) -> dict[str, str]:
    """What a front or a service submits, with the release's client; the ids by role."""
    from producer import CosyqClient  # noqa: PLC0415 (the release's, after the path is set)

    recording = io.BytesIO()
    sf.write(recording, tone(16000, 0.6), 16000, format="WAV", subtype="PCM_16")
    with CosyqClient(settings) as client:
        ids = {
            "speech": client.submit(SPEECH),
            "streamed": client.submit(STREAMED),
            "document": client.submit_document(DOCUMENT),
            "voice": client.add_voice(VOICE, recording.getvalue(), "a test prompt"),
        }
        ids["tenant_speech"] = client.for_tenant(TENANT).submit(TENANT_SPEECH)
    return ids


def contract() -> dict[str, Any]:
    """What the release's worker accepts: the request fields it knows (it refuses others)."""
    from shared.jobs import SynthesisRequest  # noqa: PLC0415

    return {"request_fields": sorted(SynthesisRequest.model_fields)}


def run_worker(settings: Any) -> None:
    from workers.worker import CosyqWorker  # noqa: PLC0415

    connection = redis.Redis.from_url(settings.redis_url)
    queues = [q for q in sorted(k.decode() for k in connection.keys("rq:queue:*"))]
    names = [q.removeprefix("rq:queue:") for q in queues]
    try:
        CosyqWorker(names, connection=connection, settings=settings).work(burst=True)
    finally:
        connection.close()


def value(raw: bytes) -> Any:
    """A stored value in readable form: text, base64'd JSON (RQ's results) and zlib'ed text
    (RQ's job data) decoded, anything else base64."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        return base64_json(text) or text
    try:
        return {"zlib": zlib.decompress(raw).decode("utf-8")}
    except (zlib.error, UnicodeDecodeError):
        return {"base64": base64.b64encode(raw).decode("ascii")}


def base64_json(text: str) -> dict[str, str] | None:
    try:
        decoded = base64.b64decode(text, validate=True).decode("utf-8")
        json.loads(decoded)
    except ValueError:  # binascii.Error, UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return {"base64_json": decoded} if decoded[:1] in ("{", "[", '"') else None


def dump_key(connection: redis.Redis, key: bytes) -> dict[str, Any]:
    kind = connection.type(key).decode()
    entry: dict[str, Any] = {"key": key.decode(), "type": kind}
    if kind == "string":
        entry["value"] = value(connection.get(key))
    elif kind == "hash":
        entry["value"] = {k.decode(): value(v) for k, v in sorted(connection.hgetall(key).items())}
    elif kind == "list":
        entry["value"] = [value(v) for v in connection.lrange(key, 0, -1)]
    elif kind == "set":
        entry["value"] = sorted(value(v) for v in connection.smembers(key))
    elif kind == "zset":
        entry["value"] = [[value(m), s] for m, s in connection.zrange(key, 0, -1, withscores=True)]
    elif kind == "stream":
        entries = connection.xrange(key)
        entry["value"] = [
            [i.decode(), {k.decode(): value(v) for k, v in fields.items()}] for i, fields in entries
        ]
        entry["groups"] = [
            {"name": g["name"].decode(), "last_delivered_id": g["last-delivered-id"].decode()}
            for g in connection.xinfo_groups(key)
        ]
    ttl = connection.pttl(key)
    entry["ttl_ms"] = ttl if ttl > 0 else None
    return entry


def transient(key: bytes) -> bool:
    """A lock of one housekeeping tick or a worker's registration: no release's state."""
    return key.endswith(b"lock") or key.startswith((b"rq:worker", b"rq:clean_"))


def dump(connection: redis.Redis, root: Path, start: float) -> list[dict[str, Any]]:
    """Every key but the transient ones, normalised (scripts/wire_normalise.py): the run
    having started at `start` (the server's clock), two runs write the same text."""
    keys = sorted(key for key in connection.keys("*") if not transient(key))
    text = json.dumps([dump_key(connection, key) for key in keys])
    normaliser = Normaliser(start=start, end=server_time(connection), host=HOST)
    entries = json.loads(relocated(text, root))
    normaliser.learn(texts(entries))
    return sorted(
        (normalised_entry(normaliser, entry) for entry in entries), key=lambda e: e["key"]
    )


def relocated(text: str, root: Path) -> str:
    """The storage root as the files name it, a URI and a path: the loader puts its own."""
    text = text.replace((root / "out").as_uri(), STORAGE_URI)
    text = text.replace(str(root / "out"), STORAGE_PATH)
    return text.replace(str(root), "{scratch}")  # the model folder, `once:` markers


def server_time(connection: redis.Redis) -> float:
    seconds, micros = connection.time()
    return seconds + micros / 1e6


def texts(entries: list[dict[str, Any]]) -> list[str]:
    """Every text of the entries, scores written out (the normaliser ranks the instants it
    finds there)."""
    found: list[str] = []

    def text(value: str) -> str:
        found.append(value)
        return value

    def score(value: float) -> float:
        found.append(repr(value))
        return value

    for entry in entries:
        mapped(entry, text, score)
    return found


def _score_member(pair: list[Any]) -> tuple[float, str]:
    return pair[1], json.dumps(pair[0])


def normalised_entry(normaliser: Normaliser, entry: dict[str, Any]) -> dict[str, Any]:
    entry = mapped(entry, normaliser.text, normaliser.score)
    if entry["type"] == "hash":
        entry["value"] = {k: normaliser.field(k, v) for k, v in entry["value"].items()}
    entry["key"] = normaliser.key(entry["key"])
    entry["ttl_ms"] = ttl_bucket_ms(entry["ttl_ms"])
    return entry


def mapped(
    entry: dict[str, Any], text: Callable[[str], str], score: Callable[[float], float]
) -> dict[str, Any]:
    """`entry` with `text` applied to its key and every text in its value (not base64'd bytes)
    and `score` to its sorted set's scores."""

    def one(value: Any) -> Any:
        if isinstance(value, str):
            return text(value)
        if "base64" in value:
            return value
        return {kind: text(inner) for kind, inner in value.items()}

    kind, value = entry["type"], entry["value"]
    if kind == "hash":
        value = {text(field): one(v) for field, v in value.items()}
        value = dict(sorted(value.items()))
    elif kind in ("list", "set"):
        value = [one(v) for v in value]
    elif kind == "zset":
        # Redis's own order once put back: equal scores (whole seconds that became one) by member
        value = sorted(([one(member), score(s)] for member, s in value), key=_score_member)
    elif kind == "stream":
        ids = stream_ids([i for i, _ in value])
        value = [[ids[i], {k: one(v) for k, v in fields.items()}] for i, fields in value]
        groups = [
            {**g, "last_delivered_id": group_position(ids, g["last_delivered_id"])}
            for g in entry["groups"]
        ]
        entry = {**entry, "groups": groups}
    else:
        value = one(value)
    return {**entry, "key": text(entry["key"]), "value": value}


def stored_files(root: Path, start: float, end: float) -> dict[str, str]:
    """Every stored file, base64'd; a JSON file's (a manifest, an audio note's) storage root and
    times normalised as the keys' are."""
    out, files = root / "out", {}
    normaliser = Normaliser(start=start, end=end, host=HOST)
    for path in sorted(out.rglob("*")):
        if not path.is_file():
            continue
        content = path.read_bytes()
        if path.suffix == ".json":
            text = relocated(content.decode("utf-8"), root)
            normaliser.learn([text])
            content = normaliser.text(text).encode("utf-8")
        name = normaliser.text(str(path.relative_to(out)))  # a date folder: EPOCH's
        files[name] = base64.b64encode(content).decode("ascii")
    return files


def write(folder: Path, name: str, content: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": FORMAT, **content}, indent=1, sort_keys=True)
    (folder / name).write_text(text + "\n", encoding="utf-8")


def main(folder: Path) -> None:
    from shared.settings import load_settings  # noqa: PLC0415
    from workers.tools.local_redis import LocalRedis  # noqa: PLC0415

    fixed_uuids()
    fixed_wav_stamps()
    with tempfile.TemporaryDirectory(prefix="cosyq-wire-") as scratch:
        root = Path(scratch)
        server = LocalRedis(root / "redis")
        server.start()
        try:
            environment(root, server.url)
            settings = load_settings(env_file=None)
            connection = redis.Redis.from_url(server.url)
            start = server_time(connection)
            ids = submit(settings)
            write(folder, "queued.json", {**snapshot(connection, root, start, ids),
                                          "contract": contract()})  # fmt: skip
            run_worker(settings)
            write(folder, "finished.json", snapshot(connection, root, start, ids))
            connection.flushall()
            shutil.rmtree(root / "out")
            start = server_time(connection)
            ids = killed_mid_job(settings, root)
            write(folder, "started.json", snapshot(connection, root, start, ids))
            connection.close()
        finally:
            server.stop()


def snapshot(
    connection: redis.Redis, root: Path, start: float, ids: dict[str, str]
) -> dict[str, Any]:
    """The ids, the keys and the stored files, normalised (the run started at `start`)."""
    keys = dump(connection, root, start)
    return {"ids": ids, "keys": keys, "files": stored_files(root, start, server_time(connection))}


def killed_mid_job(settings: Any, root: Path) -> dict[str, str]:
    """Workers SIGKILLed while they hold their jobs (the engine's `once:<marker> kill`: the
    marker is written, then the process killed): a lone worker mid-job (a speech job with a
    webhook), another mid-segment of a document, a batching one (COSYQ_BATCH_SIZE=2) holding
    a batch of two. Their heartbeats last COSYQ_HEARTBEAT_TTL_S=300 here, so no later worker's
    reaper takes an earlier one's job before the dump; the ids by role."""
    from producer import CosyqClient  # noqa: PLC0415

    marks = root / "m"
    marks.mkdir()
    batching = {
        "COSYQ_ENGINE": "tests.doubles.engines:batching",
        "COSYQ_BATCH_SIZE": "2",
        "COSYQ_BATCH_WAIT_MS": "2000",  # the first job waits for the second: one batch
    }
    with CosyqClient(settings) as client:
        ids = {"killed": client.submit({**KILLED, "text": KILLED["text"].format(marks=marks)})}
        killed_worker(1, {})
        document = {**KILLED_DOCUMENT, "text": KILLED_DOCUMENT["text"].format(marks=marks)}
        ids["killed_document"] = client.submit_document(document)
        killed_worker(2, {})
        for role, request in KILLED_BATCH.items():
            ids[role] = client.submit({**request, "text": request["text"].format(marks=marks)})
        killed_worker(3, batching)
        jobs = f"cosyq:document:{ids['killed_document']}:jobs"
        ids["killed_segment"] = client.connection.hget(jobs, "0").decode()
    return ids


def killed_worker(number: int, env: dict[str, str]) -> None:
    """One worker of the release in its own process, its uuids from `number` << 16, until
    its engine kills it."""
    command = [sys.executable, __file__, "--worker", str(number << 16)]
    worker_env = {**os.environ, "COSYQ_HEARTBEAT_TTL_S": "300", **env}
    code = subprocess.run(command, env=worker_env, timeout=120, check=False).returncode
    if code != -signal.SIGKILL:
        raise RuntimeError(f"worker {number} exited {code}: no job killed it")


def worker_main(first_uuid: int) -> None:
    from shared.settings import load_settings  # noqa: PLC0415

    fixed_uuids(first_uuid)
    fixed_wav_stamps()
    run_worker(load_settings(env_file=None))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker_main(int(sys.argv[2]))
    elif len(sys.argv) == 2:
        main(Path(sys.argv[1]).resolve())
    else:
        sys.exit(__doc__)
