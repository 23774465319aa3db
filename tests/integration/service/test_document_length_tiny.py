"""Documents on the real engine (tiny model, every piece forced to a few speech tokens) under
the deployment's default speech bound (issue 45, items 1 and 5): the issue's 843 characters of
financial text, which the worker once refused as one segment of ~440 s, are assembled; and
every segment's quality verdict reaches the document's state, manifest and result. The tiny
tokenizer makes ~2 tokens per character of this text, so the worker's own count puts segments
over the bound that the producer's estimate let through: they are spoken piece by piece."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from producer import CosyqClient
from shared.document_state import done_segments, job_ids
from shared.settings import Settings
from tests.doubles.harness import Cluster, client_settings, pool_of_two

FINANCIAL = (
    "In the third quarter revenue was 1,234,567 dollars, up 12.5% from 987,654 dollars a year "
    "before; operating costs were $2,345,678.90 against $1,987,654.32, and the margin rose to "
    "23.4% on 03/04/2025. "
)


def path_of(uri: str) -> Path:
    return Path(unquote(urlsplit(uri).path))


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path, tiny_model_dir: Path) -> Iterator[Cluster]:
    overrides = {
        "COSYQ_ENGINE": "tests.doubles.engines:tiny_directed",
        "COSYQ_MODEL_DIR": str(tiny_model_dir),
        "COSYQ_DEVICE": "cpu",
        "COSYQ_HASH_CACHE_DIR": str(tmp_path / "hashes"),
        "COSYQ_THREADS": "1",
        "TESTENGINE_FORCED_TOKENS": "8",
    }
    with pool_of_two(redis_url, tmp_path, overrides) as cluster:
        yield cluster


@pytest.fixture
def settings(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return client_settings(cluster, monkeypatch)


@pytest.mark.timeout(900)
def test_financial_prose_is_assembled_and_its_segment_verdicts_reach_the_document(
    settings: Settings,
) -> None:
    assert settings.max_speech_seconds == 150  # the default bound
    text = (FINANCIAL * 5)[:843]
    with CosyqClient(settings) as client:
        document_id = client.submit_document({"text": text, "seed": 3})
        result = client.document_result(document_id, timeout=800)
        status = client.document_status(document_id)
        done = done_segments(client.connection, document_id)
        jobs = job_ids(client.connection, document_id)
        verdicts = []
        for index in range(result.segments):
            quality = client.result(jobs[index], timeout=5).quality
            verdicts.append(None if quality is None else quality.verdict)
    assert status.state == "assembled" and result.segments == len(done) > 1
    assert [done[i].verdict for i in range(result.segments)] == verdicts
    assert status.verdicts == verdicts
    # 8 speech tokens a piece against ~0.3 s a text token: too short, so suspect
    assert "suspect" in verdicts
    suspect = [i for i, v in enumerate(verdicts) if v == "suspect"]
    assert result.verdict == status.verdict == "suspect" and result.suspect_segments == suspect
    manifest = json.loads(path_of(result.manifest_uri).read_text())
    assert [s["verdict"] for s in manifest["segments"]] == verdicts
    assert manifest["verdict"] == "suspect" and manifest["suspect_segments"] == suspect
    assert all(s["reasons"] for s in manifest["segments"] if s["verdict"] == "suspect")
