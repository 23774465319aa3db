"""A deployment upgraded over an earlier release's Redis: its settings as the fixtures were
written with (scripts/wire_fixtures.py), a storage folder, and the release's keys put back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from shared.settings import Settings, load_settings
from tests.doubles import wire
from tests.doubles.harness import write_model_dir

TENANT = "acme"  # the fixtures' named tenant (scripts/wire_fixtures.py)
VOICE = "upgrade-voice"
SPEECH_KEY = "upgrade-speech"
WEBHOOK_PREFIX = "http://127.0.0.1:9/"
WEBHOOK_URL = WEBHOOK_PREFIX + "hook"  # the fixtures' webhook: nothing listens on port 9


def deployment_env(redis_url: str, root: Path) -> dict[str, str]:
    """The settings the fixtures' release ran with, for the current worker and client."""
    return {
        "COSYQ_REDIS_URL": redis_url,
        "COSYQ_ENGINE": "tests.doubles.engines:fast",
        "COSYQ_MODEL_DIR": str(write_model_dir(root / "model")),
        "COSYQ_STORAGE_URL": (root / "out").as_uri(),
        "COSYQ_TENANTS": TENANT,
        "COSYQ_WEBHOOK_ALLOWED_URLS": WEBHOOK_PREFIX,
        "COSYQ_WEBHOOK_ALLOW_PRIVATE": "true",
        "COSYQ_RETRY_BACKOFF_S": "0",
        "COSYQ_QUALITY_IMPORT_AT_START": "false",
    }


@dataclass
class Upgraded:
    fixture: wire.Fixture
    settings: Settings
    connection: redis.Redis
    storage: Path


@pytest.fixture
def upgrade(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Upgraded]]:
    """`upgrade(release, stage, replace, age_s=0)`: the release's keys and files at `stage`
    ("queued", "finished" or "started") put back in the test's clean database (each `replace`
    key in them replaced by its value) as they were `age_s` after the dump, the current code's
    settings set."""
    opened: list[redis.Redis] = []

    def put_back(
        release: str, stage: str, replace: dict[str, str] | None = None, age_s: float = 0.0
    ) -> Upgraded:
        for name, value in deployment_env(redis_url, tmp_path).items():
            monkeypatch.setenv(name, value)
        fixture = wire.load(release, stage)
        connection = redis.Redis.from_url(redis_url)
        opened.append(connection)
        wire.restore(connection, fixture, tmp_path / "out", replace or {}, age_s=age_s)
        return Upgraded(fixture, load_settings(env_file=None), connection, tmp_path / "out")

    yield put_back
    for connection in opened:
        connection.close()
