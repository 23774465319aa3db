"""Doctor's rows and host checks, decided from given facts (the macOS branches run here too)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

from shared.settings import Settings
from workers.tools.doctor import host_checks
from workers.tools.doctor.coreml_run import plan_row
from workers.tools.doctor.measure import BackendFigures, StageFigure, prompt_audio
from workers.tools.doctor.render import as_json, print_table
from workers.tools.doctor.rows import Status, exit_status, fail, ok, skip
from workers.tools.doctor.stack_checks import coreml_runtime_row, mps_row


def settings(**values: object) -> Settings:
    return Settings.model_construct(**{**Settings().model_dump(), **values})


def test_every_fail_needs_a_hint() -> None:
    with pytest.raises(ValueError, match="fix hint"):
        fail("host", "x", "broken", "")


def test_only_a_required_fail_sets_exit_1() -> None:
    advice = fail("host", "threads", "oversubscribed", "lower COSYQ_THREADS", required=False)
    assert exit_status([ok("host", "a", "fine"), skip("run", "b", "--quick"), advice]) == 0
    assert exit_status([advice, fail("services", "Redis", "down", "start it")]) == 1
    report = as_json([advice])
    assert report["exit_status"] == 0 and report["rows"][0]["required"] is False


def test_rosetta_is_a_fail_unless_allowed() -> None:
    translated = host_checks.rosetta_row(settings(), system="darwin", translated=True)
    assert translated.status is Status.FAIL and "COSYQ_ALLOW_ROSETTA" in translated.hint
    allowed = host_checks.rosetta_row(
        settings(allow_rosetta=True), system="darwin", translated=True
    )
    assert allowed.status is Status.OK and "2-3x slower" in allowed.detail
    native = host_checks.rosetta_row(settings(), system="darwin", translated=False)
    assert native.status is Status.OK


@pytest.mark.parametrize(
    ("version", "status", "says"),
    [
        ((15, 1), Status.OK, "stateful Core ML LLM"),
        ((14, 5), Status.OK, "the LLM stays on PyTorch"),
        ((13, 6), Status.FAIL, "too old"),
    ],
)
def test_macos_version_says_what_it_enables(
    version: tuple[int, int], status: Status, says: str
) -> None:
    row = host_checks.macos_row(settings(), system="darwin", version=version)
    assert row.status is status and says in row.detail


def test_an_old_macos_fails_the_command_only_for_the_coreml_backend() -> None:
    old = (13, 6)
    assert not host_checks.macos_row(settings(backend="auto"), system="darwin", version=old).fails
    assert host_checks.macos_row(settings(backend="coreml"), system="darwin", version=old).fails


def test_macos_version_is_parsed_from_mac_ver() -> None:
    assert host_checks.macos_version(lambda: ("14.4.1", None, "arm64")) == (14, 4)
    assert host_checks.macos_version(lambda: ("", None, "")) == ()


def test_oversubscribed_threads_are_advice() -> None:
    row = host_checks.threads_row(settings(threads=4, pool_size=2), cores=4)
    assert row.status is Status.FAIL and not row.required
    assert "COSYQ_THREADS" in row.hint and "8 of 4" in row.detail
    assert host_checks.threads_row(settings(pool_size=2), cores=4).status is Status.OK


def test_an_active_omp_wait_policy_is_advice_for_a_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert host_checks.omp_row(settings(pool_size=2)).status is Status.FAIL
    assert host_checks.omp_row(settings(pool_size=1)).status is Status.OK
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert "PASSIVE" in host_checks.omp_row(settings(pool_size=2)).detail


def test_macos_only_rows_skip_elsewhere_with_the_reason() -> None:
    assert coreml_runtime_row(system="linux").detail == (
        "Core ML runs only on macOS (conversion works here)"
    )
    assert mps_row(system="linux").status is Status.SKIP


def test_the_compute_plan_needs_macos_14_4(tmp_path: Path) -> None:
    row = plan_row(tmp_path, version=(14, 3))
    assert row.status is Status.SKIP and "14.4" in row.detail


def test_stage_figures_are_json_safe() -> None:
    same = StageFigure("flow", 0.1, 0.0, math.inf).as_dict()
    assert same["snr_db"] is None and same["max_abs_error"] == 0
    assert StageFigure("HiFT", 0.1, 0.01, 42.123).as_dict()["snr_db"] == 42.12


def test_a_model_without_prompt_wav_gets_a_generated_prompt(tmp_path: Path) -> None:
    samples, rate, transcript = prompt_audio(tmp_path)
    assert rate == 16000 and samples.size == 3 * 16000 and transcript == ""
    assert 0.05 < float(abs(samples).max()) < 1.0  # voiced, not silent, not clipped


def test_the_table_shows_fixes_and_the_seed_table() -> None:
    figures = BackendFigures(
        "Core ML ALL", 1.5, 0.8, 0.4, 1.2, (StageFigure("flow", 0.2, 0.003, 38.5),)
    )
    rows = [
        ok("run", "Core ML ALL", figures.line(), **figures.as_dict()),
        fail("services", "Redis", "cannot reach Redis at redis://h:6379/0", "start redis-server"),
        skip("run", "torch-mps fp32", "MPS is Apple's GPU: macOS only"),
    ]
    out = io.StringIO()
    print_table(rows, out)
    text = out.getvalue()
    assert "fix: start redis-server" in text
    assert "skipped: MPS is Apple's GPU: macOS only" in text
    assert "the seed's table" in text and "Core ML ALL" in text and "38.5" in text
    assert "1 required check(s) failed: exit 1" in text
