"""`markup: "plain"` over HTTP (the real front, a tiny-model worker behind it): POST /v1/jobs,
/v1/jobs:batch and /v1/audio/speech take a text whose angle brackets are words ("List<String>",
"<b>", "<|user|>") and the model reads them so; without it the text is refused, 400, and the
reason names `plain`."""

from __future__ import annotations

import io

import httpx
import pytest
import soundfile as sf

from tests.integration.producer.http.conftest import Front
from tests.integration.producer.http.test_jobs_api import wait_finished

pytestmark = pytest.mark.slow

TEXT = "A List<String> and <b>bold</b>, then <|user|> here."
REFUSED = "contains the model's special token <|user|>"
HINT = 'send markup "plain" to read its angle brackets as written'


def read_as(http: httpx.Client, job_id: str) -> str:
    """The job's text as the model read it (its result's pieces: the normalised text)."""
    doc = wait_finished(http, job_id)
    assert doc["state"] == "finished", doc
    return " ".join(piece["text"] for piece in doc["result"]["pieces"])


def assert_read_as_written(read: str) -> None:
    assert "List< String>" in read and "< b>bold" in read and "user" in read, read
    assert "<|" not in read and "<b>" not in read, read


def test_jobs_and_batches_take_plain_text_and_refuse_it_as_auto_naming_plain(
    live: Front,
) -> None:
    with live.http() as http:
        refused = http.post("/v1/jobs", json={"text": TEXT})
        assert refused.status_code == 400
        message = refused.json()["error"]["message"]
        assert message.startswith(f"text: {REFUSED}") and HINT in message
        batch = {"requests": [{"text": "Fine.", "markup": "plain"}, {"text": TEXT}]}
        refused = http.post("/v1/jobs:batch", json=batch)
        assert refused.status_code == 400
        assert refused.json()["error"]["message"].startswith(f"requests[1]: text: {REFUSED}")
        submitted = http.post("/v1/jobs", json={"text": TEXT, "markup": "plain", "seed": 2})
        assert submitted.status_code == 202, submitted.text
        plain = [{"text": TEXT, "markup": "plain", "seed": n} for n in range(2)]
        batched = http.post("/v1/jobs:batch", json={"requests": plain})
        assert batched.status_code == 202, batched.text
        for job_id in [submitted.json()["id"], *batched.json()["ids"]]:
            assert_read_as_written(read_as(http, job_id))


def test_openai_speech_takes_markup_plain_and_names_it_when_refusing(live: Front) -> None:
    speech = {"model": "tts-1", "input": TEXT, "response_format": "wav"}
    with live.http() as http:
        refused = http.post("/v1/audio/speech", json=speech)
        assert refused.status_code == 400
        message = refused.json()["error"]["message"]
        assert message.startswith(f"input: {REFUSED}") and HINT in message
        spoken = http.post("/v1/audio/speech", json={**speech, "markup": "plain"})
        assert spoken.status_code == 200, spoken.text
        assert sf.info(io.BytesIO(spoken.content)).samplerate == 24000
        assert_read_as_written(read_as(http, spoken.headers["x-cosyq-job-id"]))
        wrong = http.post("/v1/audio/speech", json={**speech, "markup": "markdown"})
    assert wrong.status_code == 400
    assert wrong.json()["error"]["message"].startswith("markup: input should be 'auto' or 'plain'")
