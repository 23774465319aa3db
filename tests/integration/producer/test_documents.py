"""Documents end to end with the scripted test engine: real Redis, a pool of two real worker
processes, the producer's splitter and the assembly job. The tiny model's version is in
tests/integration/service/test_documents_tiny.py."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import soundfile as sf
import srt
import webvtt

from producer import CosyqClient
from shared.document_state import DocumentFailedError, done_segments
from shared.logs import configure_logging
from shared.settings import Settings
from tests.conftest import RedisServer
from tests.doubles.harness import Cluster, clean_database, client_settings, pool_of_two, wait_for


def settled(client: CosyqClient, document_id: str) -> bool:
    """No segment queued or running any more (the failed one may fail before the others end)."""
    status = client.document_status(document_id)
    return status.queued + status.running == 0


PARAGRAPH = (
    "The first sentence is short. The second one says a little more, and then it stops. "
    "A third sentence ends the paragraph, or would, but a fourth comes after it. Then a "
    "fifth sentence, long enough that a paragraph needs two segments, ends it for good."
)


def document(extra: str = "") -> str:
    return "\n\n".join(
        ["# A heading", PARAGRAPH, f"{PARAGRAPH} {extra}".strip(), "## Another", PARAGRAPH]
    )


@pytest.fixture(scope="module")
def cluster(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One pool for the file: its tests share no document or marker, and none needs a fresh
    worker (a pool start each, not once)."""
    root = tmp_path_factory.mktemp("documents")
    overrides = {"COSYQ_DOCUMENT_SEGMENT_CHARS": "200", "COSYQ_MAX_RETRIES": "2"}
    with clean_database(redis_server.url) as url, pool_of_two(url, root, overrides) as cluster:
        yield cluster


@pytest.fixture
def settings(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return client_settings(cluster, monkeypatch)


def path_of(uri: str) -> Path:
    return Path(unquote(urlsplit(uri).path))


def test_a_document_is_one_file_with_manifest_and_captions_and_repeats_bytes(
    settings: Settings,
) -> None:
    request = {"text": document(), "markup": "markdown", "seed": 7, "format": "flac"}
    with CosyqClient(settings) as client:
        first = client.document_result(client.submit_document(request), timeout=120)
        again_id = client.submit_document(request)
        again = client.document_result(again_id, timeout=120)
        status = client.document_status(again_id)
    assert status.state == "assembled" and status.done == status.segments == first.segments > 3
    assert again.sha256 == first.sha256  # the same document and seed: the same bytes
    info = sf.info(str(path_of(first.uri)))
    assert info.format == "FLAC" and info.samplerate == 24000
    assert info.frames / 24000 == pytest.approx(first.duration_s, abs=1e-9)
    manifest = json.loads(path_of(first.manifest_uri).read_text())
    segments = manifest["segments"]
    assert [s["index"] for s in segments] == list(range(first.segments))
    # the file is the segments and the pauses between them, nothing else
    pauses = [b["start_s"] - a["end_s"] for a, b in itertools.pairwise(segments)]
    assert all(p in (pytest.approx(0.1), pytest.approx(0.6), pytest.approx(0.9)) for p in pauses)
    assert pytest.approx(0.9) in pauses and pytest.approx(0.1) in pauses
    total = sum(s["end_s"] - s["start_s"] for s in segments) + sum(pauses)
    assert abs(total - first.duration_s) < 1 / 24000 + 1e-9
    assert segments[-1]["end_s"] == pytest.approx(first.duration_s)
    subtitles = list(srt.parse(path_of(first.srt_uri).read_text()))
    starts = [s.start.total_seconds() for s in subtitles]
    assert starts == sorted(starts) and len(subtitles) >= first.segments
    for segment in segments:  # each segment opens a cue; a long one is cut into several
        assert any(abs(start - segment["start_s"]) < 1e-3 for start in starts)
    assert all(len(s.content) <= 84 for s in subtitles)
    assert subtitles[-1].end.total_seconds() == pytest.approx(first.duration_s, abs=1e-3)
    cues = webvtt.from_string(path_of(first.vtt_uri).read_text())
    assert len(cues) == len(subtitles) and cues[0].text == subtitles[0].content
    for cue, subtitle in zip(cues, subtitles, strict=True):  # the same times, WebVTT's way
        assert cue.end.replace(".", ",") == srt.timedelta_to_srt_timestamp(subtitle.end)


def test_a_segment_failing_once_is_retried_alone(settings: Settings, tmp_path: Path) -> None:
    marker = tmp_path / "transient-marker"
    request = {"text": document(f"Then transient:{marker} happens."), "markup": "markdown"}
    with CosyqClient(settings) as client:
        document_id = client.submit_document(request)
        result = client.document_result(document_id, timeout=120)
        done = done_segments(client.connection, document_id)
    attempts = {index: d.attempt for index, d in done.items()}
    assert sorted(attempts.values())[-1] == 2 and sum(attempts.values()) == len(done) + 1
    assert result.segments == len(done)


def test_a_segment_failing_for_good_fails_the_document_and_retry_completes_it(
    settings: Settings, tmp_path: Path
) -> None:
    marker = tmp_path / "refuse-marker"
    request = {"text": document(f"Then refuse:{marker} happens."), "markup": "markdown"}
    with CosyqClient(settings) as client:
        document_id = client.submit_document(request)
        with pytest.raises(DocumentFailedError) as failed:
            client.document_result(document_id, timeout=120)
        wait_for(lambda: settled(client, document_id), 120, "the other segments to end")
        status = client.document_status(document_id)
        assert status.state == "failed" and status.failed == 1
        index = status.failures[0].index
        assert f"segment {index} (" in str(failed.value) and "refuses it" in str(failed.value)
        before = done_segments(client.connection, document_id)
        assert index not in before and len(before) == status.segments - 1
        marker.touch()
        assert client.retry_document(document_id) == [index]
        result = client.document_result(document_id, timeout=120)
        after = done_segments(client.connection, document_id)
    assert result.segments == status.segments
    assert {i: d.job_id for i, d in after.items() if i != index} == {
        i: d.job_id for i, d in before.items()
    }  # nothing done was synthesized again
    assert all(d.attempt == 1 for d in after.values())


def test_a_segment_that_finishes_between_the_status_reads_is_done_not_missing(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status reads the done list, then the jobs' states: a segment whose job finished in
    between (its audio is recorded before RQ marks it finished) is done, not "missing" with its
    audio "gone" (a 20,000-character document failed on it under load). The race is made
    certain: the first read of the done list misses the last segment, as if it were read just
    before that segment's job ended."""
    import producer.documents  # noqa: PLC0415

    with CosyqClient(settings) as client:
        document_id = client.submit_document({"text": document(), "markup": "markdown"})
        client.document_result(document_id, timeout=120)
        real = producer.documents.done_segments
        reads: list[int] = []

        def done_read_early(connection: object, doc: str) -> dict[int, object]:
            done = real(connection, doc)  # type: ignore[arg-type]
            reads.append(len(done))
            return {i: d for i, d in done.items() if i != max(done)} if len(reads) == 1 else done

        monkeypatch.setattr(producer.documents, "done_segments", done_read_early)
        status = client.document_status(document_id)
    assert len(reads) >= 2  # the done list was read again: a pending segment shows finished
    assert status.failures == [] and status.missing == 0
    assert status.done == status.segments == reads[0]


def test_cli_submits_a_document_and_writes_audio_captions_and_manifest(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from producer.cli import main  # noqa: PLC0415

    source = tmp_path / "chapter.md"
    source.write_text(document(), encoding="utf-8")
    out = tmp_path / "out" / "chapter.ogg"
    assert main(["--env-file", "", "document", "submit", str(source), "--out", str(out)]) == 0
    for suffix in (".ogg", ".srt", ".vtt", ".json"):
        assert out.with_suffix(suffix).stat().st_size > 0
    assert sf.info(str(out)).format == "OGG"
    manifest = json.loads(out.with_suffix(".json").read_text())
    capsys.readouterr()
    assert main(["--env-file", "", "document", "status", manifest["document_id"]]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "assembled"
    with CosyqClient(settings) as client:
        job_id = client.submit({"text": "One job. With captions."})
        client.result(job_id, timeout=60)
    assert main(["--env-file", "", "result", job_id, "--captions", "vtt"]) == 0
    captions = capsys.readouterr().out
    assert captions.startswith("WEBVTT") and "One job. With captions." in captions
    configure_logging(settings, stream=sys.__stderr__)  # not capsys's stream, closed after this


def test_http_routes_submit_a_document_and_serve_its_audio_and_captions(
    settings: Settings,
) -> None:
    from fastapi.testclient import TestClient  # noqa: PLC0415 (cosyq[http])

    from producer.http.app import create_app  # noqa: PLC0415

    with TestClient(create_app(settings)) as http:
        refused = http.post("/v1/documents", json={"text": "Hi.", "stream": True})
        assert refused.status_code == 400 and "stream:" in refused.json()["error"]["message"]
        accepted = http.post("/v1/documents", json={"text": document(), "markup": "markdown"})
        assert accepted.status_code == 202
        document_id = accepted.json()["id"]
        with CosyqClient(settings) as client:
            result = client.document_result(document_id, timeout=120)
        status = http.get(f"/v1/documents/{document_id}").json()
        assert status["state"] == "assembled" and status["result"]["sha256"] == result.sha256
        audio = http.get(f"/v1/documents/{document_id}/audio")
        assert audio.status_code == 200, audio.text
        assert audio.headers["content-type"] == "audio/wav"
        assert audio.content == path_of(result.uri).read_bytes()
        vtt = http.get(f"/v1/documents/{document_id}/captions", params={"format": "vtt"})
        assert vtt.text == path_of(result.vtt_uri).read_text()
        srt_text = http.get(f"/v1/documents/{document_id}/captions?format=srt").text
        assert srt_text == path_of(result.srt_uri).read_text()
        assert http.get("/v1/documents/" + "0" * 32).status_code == 404
        job = http.post("/v1/jobs", json={"text": "Captions for a job."}).json()["id"]
        with CosyqClient(settings) as client:
            client.result(job, timeout=60)
        captions = http.get(f"/v1/jobs/{job}/captions", params={"format": "srt"})
        assert captions.status_code == 200 and "Captions for a job." in captions.text
        assert http.get(f"/v1/jobs/{job}/captions?format=txt").status_code == 400
