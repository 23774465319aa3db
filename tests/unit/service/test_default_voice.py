"""The default voice is extracted once per model and prompt, then shared through Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from shared import keys
from shared.settings import load_settings
from shared.storage import open_storage
from shared.voices import VoiceRegistry
from tests.doubles.engines import ScriptedEngine
from tests.doubles.harness import write_model_dir
from workers.voices.book import VoiceBook


class CountingEngine(ScriptedEngine):
    """Counts prompt extractions (the expensive step the cache saves)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.extractions = 0

    def extract_voice(self, samples: np.ndarray, sample_rate: int, transcript: str) -> Any:
        self.extractions += 1
        return super().extract_voice(samples, sample_rate, transcript)


@pytest.fixture
def connection(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def book(tmp_path: Path, connection: redis.Redis, engine: CountingEngine, ttl: int) -> VoiceBook:
    settings = load_settings(env_file=None, storage_url=(tmp_path / "out").as_uri())
    return VoiceBook(
        engine,
        open_storage(settings),
        model_dir=tmp_path / "model",
        registry=VoiceRegistry(connection),
        max_prompt_seconds=30,
        cache_ttl_s=ttl,
    )


def test_second_worker_reads_the_default_voice_from_redis(
    tmp_path: Path, connection: redis.Redis
) -> None:
    write_model_dir(tmp_path / "model")
    first, second = CountingEngine(), CountingEngine()
    made = book(tmp_path, connection, first, ttl=60).default()
    reused = book(tmp_path, connection, second, ttl=60).default()
    assert (first.extractions, second.extractions) == (1, 0)
    assert np.array_equal(made.mel, reused.mel) and made.transcript == reused.transcript
    (key,) = connection.keys(keys.default_voice_key("*", "*"))
    assert 0 < connection.ttl(key) <= 60
    assert connection.exists(keys.VOICES_SET) == 0  # not a registered voice


def test_changed_prompt_or_no_cache_extracts_again(tmp_path: Path, connection: redis.Redis) -> None:
    write_model_dir(tmp_path / "model")
    engines = [CountingEngine() for _ in range(3)]
    book(tmp_path, connection, engines[0], ttl=60).default()
    (tmp_path / "model" / "prompt.txt").write_text("another transcript")
    book(tmp_path, connection, engines[1], ttl=60).default()
    book(tmp_path, connection, engines[2], ttl=0).default()
    assert [e.extractions for e in engines] == [1, 1, 1]
