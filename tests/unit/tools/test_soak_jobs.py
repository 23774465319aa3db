"""The soak's job mix covers every mode, format and voice kind; its bad jobs are bad where
they should be (the producer passes all but the raw ones, which it would refuse)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits, validate_request
from shared.settings import load_settings
from workers.tools.bench.soak_jobs import BAD_KINDS, SOAK_VOICE, soak_jobs
from workers.tools.bench.soak_report import ProcessMemory, SoakOptions, SoakReport


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "prompt.wav").write_bytes(b"")
    (tmp_path / "prompt.txt").write_text("a prompt\n", encoding="utf-8")
    return tmp_path


def test_the_mix_covers_modes_formats_voices_and_every_bad_kind(model_dir: Path) -> None:
    jobs = soak_jobs(200, 20, model_dir)
    good = [job.request for job in jobs if not job.bad]
    assert {r["mode"] for r in good} == {"zero_shot", "cross_lingual", "instruct2"}
    assert {r["format"] for r in good} == {"wav", "flac", "ogg"}
    assert any(r.get("sample_format") == "float32" for r in good)
    assert {r.get("sample_rate") for r in good} >= {8000, 16000, 48000, None}
    assert any(r.get("voice") == SOAK_VOICE for r in good)
    assert any("prompt_audio" in r for r in good)
    assert any("voice" not in r and "prompt_audio" not in r for r in good)
    assert {job.bad_kind for job in jobs if job.bad} == set(BAD_KINDS)
    assert sum(job.bad for job in jobs) == 10
    assert soak_jobs(200, 20, model_dir) == jobs  # seeded: the same mix every run


def test_the_raw_bad_jobs_are_the_ones_the_producer_refuses(model_dir: Path) -> None:
    """`raw` jobs bypass the producer, which would refuse them: by its rules, or (an unknown
    voice, valid as written) by its lookup at submit; every other job passes its rules."""
    limits = RequestLimits.from_settings(load_settings(env_file=None))
    for job in soak_jobs(80, 4, model_dir):
        assert job.raw == (job.bad_kind in ("unknown_voice", "raw_invalid")), job.bad_kind
        if job.raw and job.bad_kind != "unknown_voice":
            with pytest.raises(InvalidRequestError):
                validate_request(job.request, limits)
        else:
            validate_request(job.request, limits)


def test_rss_after_the_first_and_last_job_come_from_the_samples() -> None:
    process = ProcessMemory(7, job_ends=[10.0, 30.0], samples=[(5, 1e8), (11, 2e8), (31, 3e8)])
    assert process.first_job_mb == pytest.approx(2e8 / 2**20)
    assert process.last_job_mb == pytest.approx(3e8 / 2**20)
    report = SoakReport(SoakOptions(), 3, 1, 2, 1, 0, 4, 0, 9.87654, 1.0, [process], [], (0, 0))
    assert report.as_json() == {
        "jobs": 3, "bad": 1, "finished": 2, "failed": 1, "lost": 0, "recycles": 4,
        "max_rss_mb": round(3e8 / 2**20, 1), "wall_s": 9.88,
    }  # fmt: skip
