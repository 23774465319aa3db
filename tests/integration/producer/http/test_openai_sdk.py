"""The official openai SDK against `cosyq serve` with a tiny-model worker: every format, the
streaming-response API, instructions, and the errors the SDK turns into its exceptions."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import numpy as np
import openai
import pytest
import soundfile as sf

from tests.integration.producer.http.conftest import API_KEY, Front
from tests.integration.producer.http.test_jobs_api import wait_finished

pytestmark = pytest.mark.slow

TEXT = "Hello there, this is a test."
# response_format -> (content type, soundfile's format name when it reads the bytes)
FORMATS = {
    "wav": ("audio/wav", "WAV"),
    "flac": ("audio/flac", "FLAC"),
    "mp3": ("audio/mpeg", "MP3"),
    "opus": ("audio/ogg; codecs=opus", "OGG"),
}


@pytest.fixture
def client(live: Front) -> Iterator[openai.OpenAI]:
    with sdk(live) as client:
        yield client


def sdk(front: Front, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=front.url + "/v1", max_retries=0, timeout=60)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_speech_create_in_each_format_reads_back(client: openai.OpenAI, fmt: str) -> None:
    response = client.audio.speech.with_raw_response.create(
        model="tts-1",
        voice="default",
        input=TEXT,
        response_format=fmt,  # type: ignore[arg-type]
    )
    content_type, container = FORMATS[fmt]
    assert response.headers["content-type"] == content_type
    data = response.parse().content
    info = sf.info(io.BytesIO(data))
    samples, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert info.format == container and rate == 24000
    assert samples.ndim == 1 and samples.size > 2400  # at least 0.1 s
    assert np.isfinite(samples).all()


def test_pcm_is_raw_24k_int16(client: openai.OpenAI) -> None:
    pcm = client.audio.speech.create(
        model="cosyvoice2", voice="default", input=TEXT, response_format="pcm"
    ).content
    assert len(pcm) % 2 == 0 and len(pcm) > 4800
    assert not pcm.startswith(b"RIFF")
    samples = np.frombuffer(pcm, dtype="<i2")
    assert np.abs(samples).max() > 0


def test_with_streaming_response_delivers_the_whole_file(
    live: Front, client: openai.OpenAI
) -> None:
    with client.audio.speech.with_streaming_response.create(
        model="tts-1-hd", voice="default", input=TEXT, response_format="flac"
    ) as response:
        assert response.status_code == 200
        job_id = response.headers["x-cosyq-job-id"]
        data = b"".join(response.iter_bytes(chunk_size=1024))
    samples, rate = sf.read(io.BytesIO(data))
    assert rate == 24000 and samples.size > 0
    with live.http() as http:
        status = http.get(f"/v1/jobs/{job_id}").json()
    assert status["state"] == "finished" and status["result"]["format"] == "flac"
    assert status["result"]["bytes"] == len(data)


def test_instructions_turn_on_instruct2(live: Front, client: openai.OpenAI) -> None:
    response = client.audio.speech.with_raw_response.create(
        model="tts-1",
        voice="default",
        input=TEXT,
        response_format="wav",
        instructions="Speak slowly and calmly.",
    )
    job_id = response.headers["x-cosyq-job-id"]
    assert sf.info(io.BytesIO(response.parse().content)).samplerate == 24000
    with live.http() as http:
        submitted = http.get(f"/v1/jobs/{job_id}").json()["submitted"]
    assert submitted["mode"] == "instruct2"


def test_a_wrong_key_is_an_authentication_error(live: Front) -> None:
    with (
        sdk(live, key="not-the-key") as client,
        pytest.raises(openai.AuthenticationError) as caught,
    ):
        client.audio.speech.create(model="tts-1", voice="default", input=TEXT)
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"


def test_validation_errors_name_the_field_and_rule(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(model="tts-1", voice="default", input=TEXT, speed=4.0)
    assert caught.value.param == "speed"
    assert "speed: 4.0 is outside 0.5-2.0" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(
            model="tts-1", voice="default", input=TEXT, response_format="aac"
        )
    assert caught.value.param == "response_format"
    assert "aac is not supported; use one of wav, flac, opus, mp3, pcm" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(model="tts-1", voice="default", input="   ")
    assert caught.value.param == "input" and "input: must not be empty" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(model="gpt-4o-mini-tts", voice="default", input=TEXT)
    assert caught.value.param == "model"


def test_an_unknown_voice_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
    assert caught.value.param == "voice" and caught.value.code == "voice_not_found"


def test_streamed_speech_arrives_in_chunks_equal_to_the_stored_file(
    live: Front, client: openai.OpenAI
) -> None:
    with client.audio.speech.with_streaming_response.create(
        model="tts-1",
        voice="default",
        input="A longer sentence, so that the audio comes in more than one chunk.",
        response_format="pcm",
        extra_body={"stream_format": "audio"},
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        job_id = response.headers["x-cosyq-job-id"]
        parts = list(response.iter_bytes())
    pcm = b"".join(parts)
    with live.http() as http:
        # the stream ends at the attempt's final entry; the job's record is finished just after
        doc = wait_finished(http, job_id)
        assert doc["state"] == "finished", doc
        result = doc["result"]
        stored = http.get(f"/v1/jobs/{job_id}/audio").content
    samples, rate = sf.read(io.BytesIO(stored), dtype="int16")
    assert rate == 24000 and result["format"] == "wav"
    assert np.array_equal(np.frombuffer(pcm, dtype="<i2"), samples)  # PCM16 WAV: exact


def test_streamed_speech_as_server_sent_events(live: Front) -> None:
    body = {
        "model": "cosyvoice2",
        "input": "Streamed as events.",
        "voice": "default",
        "response_format": "wav",
        "stream_format": "sse",
    }
    with live.http() as http:
        response = http.post("/v1/audio/speech", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")
    ]
    assert events[-1]["type"] == "speech.audio.done"
    deltas = [base64.b64decode(e["audio"]) for e in events[:-1]]
    assert all(e["type"] == "speech.audio.delta" for e in events[:-1]) and deltas
    assert all(deltas)  # the real worker's final entry has no samples: it sends no delta
    assert sum(len(d) for d in deltas) > 2400 * 2


def test_the_sdk_sends_markup_plain_as_extra_body(live: Front, client: openai.OpenAI) -> None:
    """Our `markup` through OpenAI's SDK, as the README says: code-like prose is refused as
    `auto` (BadRequestError naming plain) and spoken as written with extra_body."""
    text = "Call size() on a List<String> after <|user|>."
    with pytest.raises(openai.BadRequestError, match=r"input: .*send markup .*plain"):
        client.audio.speech.create(model="tts-1", voice="default", input=text)
    response = client.audio.speech.with_raw_response.create(
        model="tts-1",
        voice="default",
        input=text,
        response_format="wav",
        extra_body={"markup": "plain"},
    )
    assert sf.info(io.BytesIO(response.parse().content)).samplerate == 24000
    with live.http() as http:
        doc = wait_finished(http, response.headers["x-cosyq-job-id"])
    read = " ".join(piece["text"] for piece in doc["result"]["pieces"])
    assert "List< String>" in read and "<|" not in read, read
