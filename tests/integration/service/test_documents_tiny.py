"""A long document on the real engine (tiny model, cpu, every piece forced to a few speech
tokens so the random LLM stops) over a pool of two workers: one file that is exactly its
segments and pauses, a manifest and captions on its time line, the same bytes again for the
same seed, and a segment failing once, then for good, then retried alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import soundfile as sf
import srt

from producer import CosyqClient
from shared.document_state import DocumentFailedError, done_segments, load_plan
from shared.settings import Settings
from tests.conftest import RedisServer
from tests.doubles.harness import (
    Cluster,
    clean_database,
    client_settings,
    pool_of_two,
    wait_for,
)


def settled(client: CosyqClient, document_id: str) -> bool:
    """No segment queued or running any more (the failed one may fail before the others end)."""
    status = client.document_status(document_id)
    return status.queued + status.running == 0


FRAME_S = 480 / 24000  # one mel frame of audio
WORDS = [
    "river",
    "stone",
    "lantern",
    "quiet",
    "morning",
    "paper",
    "garden",
    "window",
    "letter",
    "silver",
    "meadow",
    "harbor",
    "candle",
    "winter",
    "orchard",
    "bridge",
]


def long_text(chars: int) -> str:
    """Paragraphs of plain sentences, `chars` characters in all."""
    sentences, i = [], 0
    while sum(len(s) + 1 for s in sentences) < chars:
        words = [WORDS[(i * 7 + k) % len(WORDS)] for k in range(6 + i % 5)]
        sentences.append(" ".join(words).capitalize() + ".")
        i += 1
    paragraphs = [" ".join(sentences[j : j + 9]) for j in range(0, len(sentences), 9)]
    return "\n\n".join(paragraphs)[:chars].rsplit(".", 1)[0] + "."


@pytest.fixture(scope="module")
def cluster(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[Cluster]:
    """One pool for the file: the tests share no document, marker or seed, and each starts
    from loaded workers (two staggered model loads, ~6 s on a busy machine: once, not twice)."""
    root = tmp_path_factory.mktemp("documents")
    overrides = {
        "COSYQ_ENGINE": "tests.doubles.engines:tiny_directed",
        "COSYQ_MODEL_DIR": str(tiny_model_dir),
        "COSYQ_DEVICE": "cpu",
        "COSYQ_HASH_CACHE_DIR": str(root / "hashes"),
        "COSYQ_DOCUMENT_KEEP_SEGMENTS": "true",
        "COSYQ_DOCUMENT_SEGMENT_CHARS": "1000",  # the default: ~20 segments of 20,000 chars
        # The tiny tokenizer makes ~0.7 tokens per character, where Qwen2's makes ~0.25: its
        # speech estimate of a 1,000-character segment (~210 s) is over the default bound.
        "COSYQ_MAX_SPEECH_SECONDS": "400",
        # Pieces of Qwen2's size in characters (80 of its tokens, ~320 characters): 240 of
        # the tiny tokenizer's, ~3 pieces a segment, not 13 (each piece a whole LLM, flow and
        # vocoder pass, ~70 ms of overhead on the tiny model): still several cues a segment.
        "COSYQ_MAX_PIECE_TOKENS": "240",
        "COSYQ_THREADS": "1",
        "TESTENGINE_FORCED_TOKENS": "8",
        "TESTENGINE_FLOW_STEPS": "1",  # the time line is checked here, not the audio
    }
    with clean_database(redis_server.url) as url, pool_of_two(url, root, overrides) as cluster:
        yield cluster


@pytest.fixture
def settings(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return client_settings(cluster, monkeypatch)


def path_of(uri: str) -> Path:
    return Path(unquote(urlsplit(uri).path))


@pytest.mark.timeout(1500)
def test_a_20000_character_document_is_its_segments_and_pauses(settings: Settings) -> None:
    text = long_text(20_000)
    assert len(text) > 19_900
    with CosyqClient(settings) as client:
        document_id = client.submit_document({"text": text, "seed": 11})
        result = client.document_result(document_id, timeout=1400)
        plan = load_plan(client.connection, document_id)
        done = done_segments(client.connection, document_id)
    assert len(plan.segments) == result.segments > 10
    frames = sf.info(str(path_of(result.uri))).frames
    assert frames / 24000 == pytest.approx(result.duration_s, abs=1e-9)
    segments_s = sum(sf.info(str(path_of(done[i].uri))).duration for i in done)
    pauses_s = sum(s.pause_before_s for s in plan.segments[1:])
    assert abs(segments_s + pauses_s - result.duration_s) < FRAME_S
    manifest = json.loads(path_of(result.manifest_uri).read_text())
    ends = [(s["start_s"], s["end_s"]) for s in manifest["segments"]]
    flat = [t for pair in ends for t in pair]
    assert flat == sorted(flat) and ends[-1][1] == pytest.approx(result.duration_s)
    cues = list(srt.parse(path_of(result.srt_uri).read_text()))
    times = [t.total_seconds() for c in cues for t in (c.start, c.end)]
    assert times == sorted(times) and len(cues) > len(ends)  # one cue per piece
    assert cues[-1].end.total_seconds() <= result.duration_s + 1e-3
    assert result.duration_s - cues[-1].end.total_seconds() < FRAME_S


@pytest.mark.timeout(900)
def test_same_seed_same_bytes_and_failing_segments_are_retried_alone(
    settings: Settings, tmp_path: Path
) -> None:
    text = long_text(2500)
    with CosyqClient(settings) as client:
        first = client.document_result(client.submit_document({"text": text, "seed": 5}), 400)
        again = client.document_result(client.submit_document({"text": text, "seed": 5}), 400)
        assert again.sha256 == first.sha256 and first.segments >= 2
        once, good = tmp_path / "once", tmp_path / "good"
        flaky = f"It starts transient:{once} here. {text} And refuse:{good} ends it."
        document_id = client.submit_document({"text": flaky, "seed": 5})
        with pytest.raises(DocumentFailedError, match=r"segment \d+ \("):
            client.document_result(document_id, timeout=400)
        wait_for(lambda: settled(client, document_id), 400, "the other segments to end")
        before = done_segments(client.connection, document_id)
        assert max(d.attempt for d in before.values()) == 2  # failed once, retried alone
        status = client.document_status(document_id)
        assert status.failed == 1 and len(before) == status.segments - 1
        good.touch()
        assert client.retry_document(document_id) == [status.failures[0].index]
        client.document_result(document_id, timeout=400)
        after = done_segments(client.connection, document_id)
    assert {i: after[i].job_id for i in before} == {i: d.job_id for i, d in before.items()}


@pytest.mark.timeout(400)
def test_captions_of_text_with_an_arrow_and_markup_characters(settings: Settings) -> None:
    """Prose may hold "-->" (webvtt-py refuses to write it in a cue: the document's assembly
    failed), "<" and "&" (WebVTT's own markup): each file shows the text as written, and has
    exactly one cue per piece."""
    import webvtt  # noqa: PLC0415

    text = "Turn left --> then right. Keep a < b & c."
    with CosyqClient(settings) as client:
        result = client.document_result(client.submit_document({"text": text, "seed": 3}), 300)
    manifest = json.loads(path_of(result.manifest_uri).read_text())
    spoken = [cue["text"] for cue in manifest["captions"]]
    assert any("-->" in said for said in spoken) and any("<" in said for said in spoken)
    cues = list(srt.parse(path_of(result.srt_uri).read_text()))
    assert [c.content for c in cues] == [said.replace("-->", "->") for said in spoken]
    vtt = webvtt.from_string(path_of(result.vtt_uri).read_text())
    shown = [c.text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") for c in vtt]
    assert shown == spoken and all("-->" not in c.text for c in vtt)
