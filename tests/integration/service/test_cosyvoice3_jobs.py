"""A worker on a CosyVoice 3 directory, through the real queue: real Redis, one real worker
process on the tiny CosyVoice 3 (`init-tiny --family cosyvoice3`), the demo's seven jobs plus a
streamed one, a voice added through the queue, a voice of the other family refused, and a
document of a few segments assembled into one file that is exactly its segments and pauses.

One worker serves every job (its model loads once), alone or batching: the family is read from
the directory, no setting names it. Pieces are forced to a fixed number of speech tokens and the
flow takes two Euler steps (`tests.doubles.engines:tiny_forced`), so every duration is known in
advance and the test stays cheap (the issue allows the suite 10% more for the second family).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest
import soundfile as sf

from producer import CosyqClient
from shared.document_state import done_segments, load_plan
from shared.errors import JobFailedError
from shared.settings import Settings
from shared.voices import VoiceRegistry
from tests.doubles.harness import Cluster, client_settings
from workers.engine.api import ModelIdentity, VoicePrompt
from workers.tools.demo import DEMO_REQUESTS
from workers.voices.profiles import profile_from_prompt

FORCED = 30  # speech tokens per piece: 30 x 2 mel frames x 480 samples = 1.2 s of audio
PIECE_S = FORCED * 2 * 480 / 24000
FORMATS = {"wav": "WAV", "flac": "FLAC", "ogg": "OGG"}
THINGS = ("lake", "hill", "road", "sky")
DOCUMENT = "\n\n".join(  # three paragraphs of about 130 characters: one segment each
    " ".join(f"The {colour} {thing} is calm and plain." for thing in THINGS)
    for colour in ("red", "blue", "green")
)


def path_of(uri: str) -> Path:
    return Path(unquote(urlsplit(uri).path))


@pytest.fixture
def cluster(
    redis_url: str, tmp_path: Path, tiny3_model_dir: Path, worker_batch_size: int
) -> Iterator[Cluster]:
    """One worker, taking one job at a time or batching up to 8 (as every worker test)."""
    overrides = {
        "COSYQ_ENGINE": "tests.doubles.engines:tiny_forced",  # the real engine, forced length
        "TESTENGINE_FORCED_TOKENS": str(FORCED),
        "COSYQ_MODEL_DIR": str(tiny3_model_dir),
        "COSYQ_DEVICE": "cpu",
        "COSYQ_THREADS": "1",
        "COSYQ_BATCH_SIZE": str(worker_batch_size),
        "COSYQ_HASH_CACHE_DIR": str(tmp_path / "hashes"),
        "COSYQ_MAX_RETRIES": "0",
        "COSYQ_DOCUMENT_SEGMENT_CHARS": "200",  # the document below: three segments or more
        "COSYQ_DOCUMENT_KEEP_SEGMENTS": "true",
    }
    cluster = Cluster(redis_url=redis_url, root=tmp_path, overrides=overrides)
    cluster.start("run", log_name="worker.log")
    yield cluster
    cluster.stop_all()


@pytest.fixture
def settings(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return client_settings(cluster, monkeypatch)


def other_family_voice(client: CosyqClient) -> None:
    """A voice registered by a CosyVoice 2 worker (its profile as such a worker stores it)."""
    rng = np.random.default_rng(0)
    prompt = VoicePrompt(
        speech_tokens=rng.integers(0, 6561, 25).astype(np.int32),
        mel=rng.standard_normal((50, 80)).astype(np.float32),
        embedding=rng.standard_normal(192).astype(np.float32),
        transcript="a prompt from the other family",
    )
    identity = ModelIdentity("CosyVoice2-0.5B", "c" * 16, "torch", "cpu", family="cosyvoice2")
    profile = profile_from_prompt(
        "cv2voice", prompt, identity=identity, source_sample_rate=24000, source_seconds=1.0
    )
    VoiceRegistry(client.connection).save(profile)


@pytest.mark.timeout(900)
def test_the_demo_jobs_run_end_to_end_on_cosyvoice3(
    settings: Settings, cluster: Cluster, tiny3_model_dir: Path
) -> None:
    with CosyqClient(settings) as client:
        other_family_voice(client)
        refused = client.submit({"text": "Hello.", "voice": "cv2voice", "output_key": "no.wav"})
        jobs = [client.submit(dict(request)) for request in DEMO_REQUESTS]
        streamed = client.submit({"text": "Hello there.", "stream": True, "seed": 8})
        recording = (tiny3_model_dir / "prompt.wav").read_bytes()
        added = client.add_voice("cv3voice", recording, "A prompt of the tiny model.")
        document_id = client.submit_document({"text": DOCUMENT, "seed": 4})
        with pytest.raises(JobFailedError) as failed:
            client.result(refused, timeout=600)
        assert failed.value.kind == "invalid_request"
        assert "was extracted for CosyVoice 2" in str(failed.value)
        assert "this worker serves CosyVoice 3" in str(failed.value)
        results = [client.result(job, timeout=600) for job in jobs]
        stream_result = client.result(streamed, timeout=600)
        chunks = list(client.stream(streamed, timeout=30))
        summary = client.wait_for_voice(added, timeout=600)
        with_voice = client.result(client.submit({"text": "Hi.", "voice": "cv3voice"}), 600)
        document = client.document_result(document_id, timeout=600)
        plan = load_plan(client.connection, document_id)
        segments = done_segments(client.connection, document_id)
    assert not (path_of(results[0].uri).parent.parent / "no.wav").exists()  # nothing written
    for request, result in zip(DEMO_REQUESTS, results, strict=True):
        assert result.model.family == "cosyvoice3"
        data = path_of(result.uri).read_bytes()
        info = sf.info(io.BytesIO(data))
        assert info.format == FORMATS[request.get("format", "wav")], request["output_key"]
        assert info.samplerate == result.sample_rate == request.get("sample_rate", 24000)
        assert abs(info.frames / info.samplerate - result.duration_s) < 0.02
        pieces = len(result.pieces)
        assert pieces >= 1 and result.speech_tokens == FORCED * pieces
        gaps = 0.1 * (pieces - 1)  # the default pause between pieces
        speech = pieces * PIECE_S / request.get("speed", 1.0)
        assert abs(result.duration_s - speech - gaps) < 0.02 * pieces, request["output_key"]
        samples, _ = sf.read(io.BytesIO(data), dtype="float32")
        assert np.isfinite(samples).all() and np.abs(samples).max() > 0
        assert result.quality is not None  # the quality check measured CosyVoice 3's audio
    numbers = " ".join(piece.text for piece in results[5].pieces)
    assert "42" not in numbers and "forty" in numbers  # zero-shot text is normalised
    assert [p.text for p in results[3].pieces] == [DEMO_REQUESTS[3]["text"]]  # xl: as written
    # streaming: CosyVoice 3's chunk schedule, the chunks equal the stored file
    assert len(chunks) >= 2 and chunks[-1].final and stream_result.timings.first_chunk_s
    streamed_pcm = np.frombuffer(b"".join(c.pcm for c in chunks), dtype="<i2").astype(np.int32)
    stored, rate = sf.read(path_of(stream_result.uri), dtype="int16")
    assert rate == 24000 and streamed_pcm.shape == stored.shape
    assert np.abs(streamed_pcm - stored).max() <= 1
    # a voice added through the queue records the family it was extracted for
    assert summary.family == "cosyvoice3" and with_voice.model.family == "cosyvoice3"
    # a document: its segments through the same worker, one file of segments and pauses
    assert document.segments == len(plan.segments) == len(segments) >= 3
    assert sf.info(str(path_of(document.uri))).frames / 24000 == pytest.approx(document.duration_s)
    segments_s = sum(sf.info(str(path_of(done.uri))).duration for done in segments.values())
    pauses_s = sum(segment.pause_before_s for segment in plan.segments[1:])
    assert abs(segments_s + pauses_s - document.duration_s) < 480 / 24000
    assert all(done.verdict is not None for done in segments.values())  # quality checked
    events = cluster.events("worker.log")
    ready = [e for e in events if e.get("event") == "worker_ready"]
    assert len(ready) == 1  # one worker served every job: the refusal did not stop it
    assert ready[0]["family"] == "cosyvoice3"
