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
import sys
import tempfile
import uuid
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import redis
import soundfile as sf

FORMAT = 1  # of the files written here (tests/doubles/wire.py reads them)
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


def fixed_uuids() -> None:
    """uuid4 from a counter: the same ids at each run of one release."""
    counter = iter(range(1, 1 << 62))
    uuid.uuid4 = lambda: uuid.UUID(int=(0xC0 << 120) | next(counter))  # type: ignore[assignment]


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


def dump(connection: redis.Redis, root: Path) -> list[dict[str, Any]]:
    keys = sorted(key for key in connection.keys("*") if not transient(key))
    text = json.dumps([dump_key(connection, key) for key in keys])
    # the storage root as the files name it, a URI and a path: the loader puts its own
    text = text.replace((root / "out").as_uri(), STORAGE_URI)
    text = text.replace(str(root / "out"), STORAGE_PATH)
    text = text.replace(str(root), "{scratch}")  # the model folder: a cache's note of it
    return list(json.loads(text))


def stored_files(root: Path) -> dict[str, str]:
    out = root / "out"
    return {
        str(path.relative_to(out)): base64.b64encode(path.read_bytes()).decode("ascii")
        for path in sorted(out.rglob("*"))
        if path.is_file()
    }


def write(folder: Path, name: str, content: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"format": FORMAT, **content}, indent=1, sort_keys=True)
    (folder / name).write_text(text + "\n", encoding="utf-8")


def main(folder: Path) -> None:
    from shared.settings import load_settings  # noqa: PLC0415
    from workers.tools.local_redis import LocalRedis  # noqa: PLC0415

    fixed_uuids()
    with tempfile.TemporaryDirectory(prefix="cosyq-wire-") as scratch:
        root = Path(scratch)
        server = LocalRedis(root / "redis")
        server.start()
        try:
            environment(root, server.url)
            settings = load_settings(env_file=None)
            connection = redis.Redis.from_url(server.url)
            ids = submit(settings)
            write(folder, "queued.json", {"ids": ids, "keys": dump(connection, root),
                                          "files": stored_files(root),
                                          "contract": contract()})  # fmt: skip
            run_worker(settings)
            write(folder, "finished.json", {"ids": ids, "keys": dump(connection, root),
                                            "files": stored_files(root)})  # fmt: skip
            connection.close()
        finally:
            server.stop()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]).resolve())
