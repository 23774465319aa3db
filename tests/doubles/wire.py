"""An earlier release's Redis keys and stored files, put back: the golden wire fixtures.

`scripts/wire_fixtures.py`, run on a release's own code, wrote tests/data/wire/<release>/
`queued.json` (what its producer left for a worker) and `finished.json` (and what its worker
left once every job ran): each key's type, fields and TTL in readable form, with the files its
storage held. `restore` writes them into a Redis we started and a storage folder, as an
upgraded deployment finds them.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[2]
WIRE = ROOT / "tests" / "data" / "wire"
RELEASES = tuple(sorted(p.name for p in WIRE.iterdir() if p.is_dir())) if WIRE.is_dir() else ()
YEAR_S = 366 * 86400


def _normaliser() -> ModuleType:
    """scripts/wire_normalise.py (beside the script that runs on any release's code)."""
    spec = importlib.util.spec_from_file_location(
        "wire_normalise", ROOT / "scripts" / "wire_normalise.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


normalise = _normaliser()


@dataclass(frozen=True)
class Fixture:
    release: str
    ids: dict[str, str]  # the jobs' and the document's ids by role (speech, streamed, ...)
    keys: list[dict[str, Any]]
    files: dict[str, str]  # storage key -> base64 content
    contract: dict[str, Any]  # queued.json: what its worker accepts (request_fields)
    epoch: int | None = None  # format 2: its instants are normalised, the dump at epoch + 1 s

    def entry(self, key: str) -> dict[str, Any]:
        return next(e for e in self.keys if e["key"] == key)

    def call(self, job_id: str) -> tuple[str, list[Any], dict[str, Any]]:
        """A job's function, args and kwargs, as RQ's JSON serializer stored them."""
        data = json.loads(self.entry(f"rq:job:{job_id}")["value"]["data"]["zlib"])
        return data[0], data[2], data[3]


def load(release: str, stage: str) -> Fixture:
    """`stage`: "queued", "finished" or "started" (workers killed holding their jobs)."""
    data = json.loads((WIRE / release / f"{stage}.json").read_text(encoding="utf-8"))
    assert data["format"] in (1, 2), f"{release}/{stage}.json: format {data['format']}"
    epoch = normalise.EPOCH if data["format"] == 2 else None
    contract = data.get("contract", {})
    return Fixture(release, data["ids"], data["keys"], data["files"], contract, epoch)


def restore(
    connection: redis.Redis,
    fixture: Fixture,
    storage: Path,
    replace: dict[str, str],
    *,
    age_s: float = 0.0,
) -> None:
    """Every key (with its TTL) and every stored file, the storage root being `storage` and
    each of `replace`'s keys in the keys' text its value (a webhook receiver's address).

    A normalised fixture's instants are put back as if it was dumped `age_s` ago (now, by
    default): its keys whose TTL is `age_s` or less are gone, the others' TTLs that much less."""
    shift = _shift(connection, fixture, age_s)
    text = shift(_placed(json.dumps(fixture.keys), storage, replace))
    pipe = connection.pipeline(transaction=False)
    for entry in json.loads(text):
        if entry["ttl_ms"] is not None:
            entry["ttl_ms"] -= int(age_s * 1000)
            if entry["ttl_ms"] <= 0:
                continue
        _write(pipe, entry)
    pipe.execute()
    for name, content in fixture.files.items():
        path = storage / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = base64.b64decode(content)
        if fixture.epoch is not None and name.endswith(".json"):  # a manifest, an audio note
            data = shift(_placed(data.decode("utf-8"), storage, {})).encode("utf-8")
        path.write_bytes(data)


def _placed(text: str, storage: Path, replace: dict[str, str]) -> str:
    for old, new in replace.items():
        text = text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])
    return text.replace("{storage_uri}", storage.as_uri()).replace("{storage_path}", str(storage))


MINUTE_KEY = re.compile(r'("cosyq:throughput:(?:[^:"]+:)?)(\d{8})"')


def _shift(connection: redis.Redis, fixture: Fixture, age_s: float) -> Any:
    """The text's normalised instants (and minute buckets) moved to the load's time."""
    if fixture.epoch is None:
        return lambda text: text
    seconds, micros = connection.time()  # type: ignore[misc]
    by_s = seconds + micros / 1e6 - age_s - normalise.AFTER_RUN
    low, high = fixture.epoch - 86400, fixture.epoch + YEAR_S

    def shifted(text: str) -> str:
        text = MINUTE_KEY.sub(
            lambda m: f'{m.group(1)}{(int(m.group(2)) * 60 + int(by_s)) // 60}"', text
        )
        return normalise.shift_times(text, by_s, low=low, high=high)

    return shifted


def _write(pipe: Any, entry: dict[str, Any]) -> None:
    key, kind, value = entry["key"], entry["type"], entry["value"]
    if kind == "string":
        pipe.set(key, _raw(value))
    elif kind == "hash":
        pipe.hset(key, mapping={k: _raw(v) for k, v in value.items()})
    elif kind == "list":
        pipe.rpush(key, *(_raw(v) for v in value))
    elif kind == "set":
        pipe.sadd(key, *(_raw(v) for v in value))
    elif kind == "zset":
        pipe.zadd(key, {_raw(member): score for member, score in value})
    elif kind == "stream":
        for entry_id, fields in value:
            pipe.xadd(key, {k: _raw(v) for k, v in fields.items()}, id=entry_id)
        for group in entry.get("groups", []):
            pipe.xgroup_create(key, group["name"], id=group["last_delivered_id"])
    else:
        raise ValueError(f"{key}: type {kind} is not restored")
    if entry["ttl_ms"] is not None:
        pipe.pexpire(key, entry["ttl_ms"])


def _raw(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if "base64_json" in value:
        return base64.b64encode(value["base64_json"].encode("utf-8"))
    if "zlib" in value:
        return zlib.compress(value["zlib"].encode("utf-8"))
    return base64.b64decode(value["base64"])


def read_call(connection: redis.Redis, job_id: str) -> tuple[str, list[Any], dict[str, Any]]:
    """A queued job's function, args and kwargs (RQ's JSON serializer, zlib'ed)."""
    data = json.loads(zlib.decompress(connection.hget(f"rq:job:{job_id}", "data")))  # type: ignore[arg-type]
    return data[0], data[2], data[3]


def write_call(connection: redis.Redis, job_id: str, function: str, kwargs: dict[str, Any]) -> None:
    """Rewrite a queued job's call, as a later release's producer would have queued it."""
    data = json.dumps([function, None, [], kwargs]).encode("utf-8")
    connection.hset(f"rq:job:{job_id}", "data", zlib.compress(data))
