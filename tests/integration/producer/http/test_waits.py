"""Requests that wait hold a Redis connection of their front process each, so they are counted
(producer/http/waits.py): many of one tenant's POST /v1/audio/speech at once (no worker: each
would wait its whole COSYQ_HTTP_WAIT_TIMEOUT_S) get at most COSYQ_TENANT_MAX_WAITS waits, the
rest 429 `max_waits` with nothing queued, and another tenant's request still waits its turn
(never the 503 "Too many connections" of a front whose pool one tenant took)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
import redis

from tests.integration.producer.http.conftest import start_front

pytestmark = pytest.mark.slow

ALPHA_KEY, BETA_KEY = "alpha-key-" + "4" * 20, "beta-key-" + "5" * 20
MAX_WAITS = 16  # COSYQ_TENANT_MAX_WAITS by default
AT_ONCE = 24
WAIT_S = 6.0
SPEECH = {"model": "tts-1", "input": "Nobody speaks this.", "voice": "default"}


def speak_at_once(url: str, key: str, count: int) -> list[tuple[float, httpx.Response]]:
    """`count` speech requests let go together; (when each was sent, its answer)."""
    start = threading.Barrier(count)
    answers: list[tuple[float, httpx.Response]] = []

    def speak() -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as http:
            start.wait()
            sent = time.monotonic()
            answers.append((sent, http.post("/v1/audio/speech", json=SPEECH, timeout=60)))

    threads = [threading.Thread(target=speak) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_a_tenants_waits_are_counted_and_another_tenant_still_waits(
    redis_url: str, tmp_path: Path
) -> None:
    front = start_front(
        tmp_path / "front",
        redis_url,
        COSYQ_API_KEYS=f"alpha:{ALPHA_KEY},beta:{BETA_KEY}",
        COSYQ_HTTP_WAIT_TIMEOUT_S=str(WAIT_S),
    )
    try:
        beta: list[httpx.Response] = []

        def beta_speaks() -> None:
            with front.http(key=BETA_KEY) as http:
                beta.append(http.post("/v1/audio/speech", json=SPEECH))

        later = threading.Timer(1.0, beta_speaks)
        later.start()
        answers = speak_at_once(front.url, ALPHA_KEY, AT_ONCE)
        later.join()
    finally:
        front.stop()
    sent = [moment for moment, _ in answers]
    assert max(sent) - min(sent) < WAIT_S / 2  # all sent while the first ones still wait
    waited = [a for _, a in answers if a.status_code == 504]
    refused = [a for _, a in answers if a.status_code == 429]
    assert len(waited) + len(refused) == AT_ONCE, [a.text for _, a in answers]
    assert len(waited) <= MAX_WAITS
    for answer in refused:
        error = answer.json()["error"]
        assert error["code"] == "max_waits" and "nothing was submitted" in error["message"]
        assert answer.headers["retry-after"]
    queued = redis.Redis.from_url(redis_url).llen("rq:queue:cosyq-default.alpha")
    assert queued == len(waited)  # a refused wait queued nothing
    assert [answer.status_code for answer in beta] == [504]  # it waited: beta is not held back
