"""A request's checks run in a thread, never on the front's event loop: the loop serves every
tenant's requests, and a hostile body's check is Python that takes its time (60,000 metadata
items walked, or 21,000 unknown fields named: ~0.5 s), during which a /healthz on the same
process waited 1.0-1.5 s. In a thread the interpreter hands the loop its turn every few ms.

The checks are wrapped to note whether they were called on a thread running an event loop;
they still do their work (a spy, not a stand-in), against the real app and Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import producer.http.jobs as jobs_routes
import producer.http.speech as speech_routes
from producer.http.app import create_app
from shared.settings import load_settings

SPEECH = {"model": "tts-1", "input": "Hello there.", "voice": "default", "response_format": "wav"}


def noting(calls: list[tuple[str, bool]], name: str, check: Callable[..., Any]) -> Callable:
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:  # no loop runs on this thread: a worker thread
            on_loop = False
        calls.append((name, on_loop))
        return check(*args, **kwargs)

    return checked


def test_a_requests_checks_never_run_on_the_event_loop(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(
        None, redis_url=redis_url, storage_url=tmp_path.as_uri(), http_wait_timeout_s=0.5
    )
    calls: list[tuple[str, bool]] = []
    for module, name in (
        (jobs_routes, "validate_request"),
        (speech_routes, "validate_request"),
        (speech_routes, "parse_speech"),
    ):
        label = f"{module.__name__}.{name}"
        monkeypatch.setattr(module, name, noting(calls, label, getattr(module, name)))
    with TestClient(create_app(settings)) as http:
        assert http.post("/v1/jobs", json={"text": "Hello there."}).status_code == 202
        refused = http.post("/v1/jobs", json={"text": "Hi.", "colour": "red"})
        assert refused.json()["error"]["message"] == "colour: unknown field"
        assert http.post("/v1/audio/speech", json={**SPEECH, "speed": 9}).status_code == 400
        assert http.post("/v1/audio/speech", json=SPEECH).status_code == 504  # no worker here
    checked = {name for name, _ in calls}
    assert checked == {
        "producer.http.jobs.validate_request",
        "producer.http.speech.validate_request",
        "producer.http.speech.parse_speech",
    }
    assert [name for name, on_loop in calls if on_loop] == []
