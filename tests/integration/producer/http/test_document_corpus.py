"""Ordinary text through the document path over HTTP, with a real worker (the tiny model):
prose with headings, lists, URLs, e-mail addresses, code spans, a table, quotes, emoji, dashes
and ellipses, Chinese, Japanese and English in one paragraph, a run-on sentence of 3,000
characters without a full stop (600 here: the tiny model is slow on a shared CPU; the
splitter's tests take 3,000), paragraphs of punctuation or numbers alone, blank lines of
whitespace, Windows line ends, a BOM, zero-width characters, NBSP and tabs. Each document
finishes, and its file, manifest and captions agree: every segment has its own stretch of
audio, in order, and that stretch is not silent."""

from __future__ import annotations

import io
import json
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest
import soundfile

from tests.doubles.harness import wait_for
from tests.integration.producer.http.conftest import Front

DONE_TIMEOUT_S = 240.0
RUN_ON = " ".join(f"and then the {n}th clause went on without a stop" for n in range(15))[:600]
PROSE = "\r\n".join(
    [
        "\ufeff# A chapter — the first one",
        "",
        "It was a bright cold day in April\u2026 and the clocks were striking thirteen. See "
        "https://example.com/a?b=c&d=e or write to jane.doe+tts@example.co.uk today!",
        "",
        "- a bullet with `inline code` in it",
        "- another\u00a0bullet\twith a tab and a zero\u200bwidth space",
        "1. the first step",
        "2. the second step, 3.5% faster than 1,234 others",
        "",
        "| name | value |",
        "|------|-------|",
        "| one  | 1     |",
        "",
        "> \u201cA quote,\u201d she said \u2014 and smiled \U0001f600.",
        "",
        "\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002The weather is nice. "
        "\u4eca\u65e5\u306f\u3044\u3044\u5929\u6c17\u3067\u3059\u306d\u3002",
        "",
        "!!! ??? ...",
        "",
        "12345 678 90",
        "",
        " \t \u00a0 ",
        "",
        RUN_ON,
        "",
        "\u2026",
    ]
)


def finished(front: Front, document: dict) -> dict:
    with front.http() as http:
        answer = http.post("/v1/documents", json=document)
        assert answer.status_code == 202, answer.text
        document_id = answer.json()["id"]

        def done() -> dict | None:
            status = http.get(f"/v1/documents/{document_id}").json()
            return status if status["state"] in ("assembled", "failed", "incomplete") else None

        status = wait_for(done, DONE_TIMEOUT_S, f"document {document_id}", interval=0.5)
        assert status["state"] == "assembled", status
        audio = http.get(f"/v1/documents/{document_id}/audio")
        assert audio.status_code == 200
        status["audio"] = audio.content
        for fmt in ("srt", "vtt"):
            captions = http.get(f"/v1/documents/{document_id}/captions", params={"format": fmt})
            assert captions.status_code == 200
            status[fmt] = captions.text
    return status


@pytest.mark.timeout(300)
def test_ordinary_text_finishes_and_its_file_manifest_and_captions_agree(live: Front) -> None:
    """Plain text, the default reading (Markdown's split of the same text: the splitter's
    tests, tests/unit/engine/test_document_segments.py)."""
    status = finished(live, {"text": PROSE, "format": "wav", "seed": 5})
    manifest_path = Path(unquote(urlsplit(status["result"]["manifest_uri"]).path))
    manifest = json.loads(manifest_path.read_text())
    samples, rate = soundfile.read(io.BytesIO(status["audio"]), dtype="float32")
    segments = manifest["segments"]
    assert len(segments) == status["segments"] == status["result"]["segments"] >= 2
    assert [s["index"] for s in segments] == list(range(len(segments)))
    ends = [0.0]
    for segment in segments:
        assert ends[-1] <= segment["start_s"] < segment["end_s"]
        ends.append(segment["end_s"])
        stretch = samples[round(segment["start_s"] * rate) : round(segment["end_s"] * rate)]
        assert np.sqrt(np.mean(np.square(stretch))) > 1e-4, segment["index"]  # spoken
    assert abs(len(samples) / rate - manifest["duration_s"]) < 0.05
    assert ends[-1] <= manifest["duration_s"] + 1e-3
    assert "clause went on" in " ".join(s["text"] for s in segments)  # the run-on is read
    cues = manifest["captions"]
    assert cues and status["vtt"].startswith("WEBVTT")
    assert status["srt"].count(" --> ") == status["vtt"].count(" --> ") == len(cues)
    assert all(c["start_s"] < c["end_s"] <= manifest["duration_s"] + 1e-3 for c in cues)
