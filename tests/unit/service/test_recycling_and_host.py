"""Recycling limits and host hygiene, without processes."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from workers.service import host
from workers.service.recycling import RecyclePolicy, RecycleReason, RecycleTracker


def policy(**values: object) -> RecyclePolicy:
    base = {"max_jobs": 200, "max_jobs_jitter": None, "max_rss_mb": 1000, "max_lifetime_s": 60}
    return RecyclePolicy.from_settings(SimpleNamespace(**{**base, **values}))  # type: ignore[arg-type]


def test_jitter_defaults_to_ten_percent_rounded_down() -> None:
    assert policy(max_jobs=200).max_jobs_jitter == 20
    assert policy(max_jobs=9).max_jobs_jitter == 0
    assert policy(max_jobs=200, max_jobs_jitter=3).max_jobs_jitter == 3


def test_job_budget_is_drawn_per_process_within_the_jitter() -> None:
    budgets = {policy(max_jobs=100).job_budget(random.Random(seed)) for seed in range(200)}
    assert min(budgets) >= 100 and max(budgets) <= 110 and len(budgets) > 5


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_tracker_reasons_in_order_of_urgency() -> None:
    clock = Clock()
    tracker = RecycleTracker(policy(max_rss_mb=500), job_budget=3, clock=clock)
    assert tracker.after_job(rss_mb=100, timed_out=False) is None
    assert tracker.after_job(rss_mb=900, timed_out=True) is RecycleReason.JOB_TIMEOUT
    assert tracker.after_job(rss_mb=900, timed_out=False) is RecycleReason.RSS
    assert tracker.after_job(rss_mb=100, timed_out=False) is RecycleReason.MAX_JOBS
    fresh = RecycleTracker(policy(max_lifetime_s=60), job_budget=100, clock=clock)
    clock.now = 61
    assert fresh.lifetime_expired()
    assert fresh.after_job(rss_mb=100, timed_out=False) is RecycleReason.LIFETIME
    assert RecycleReason.JOB_TIMEOUT.urgent and not RecycleReason.MAX_JOBS.urgent


def test_threads_split_physical_cores_across_the_pool() -> None:
    assert host.threads_per_worker(None, pool_size=4, cores=10) == 2
    assert host.threads_per_worker(None, pool_size=16, cores=8) == 1  # at least 1
    assert host.threads_per_worker(3, pool_size=4, cores=10) == 3  # the setting wins


def test_rosetta_detection_reads_sysctl_only_on_macos() -> None:
    assert host.is_translated("darwin", lambda: "1") is True
    assert host.is_translated("darwin", lambda: "0") is False
    assert host.is_translated("darwin", lambda: None) is False  # Intel Mac: no such key
    assert host.is_translated("linux", lambda: "1") is False


def test_translated_python_is_refused_unless_allowed() -> None:
    with pytest.raises(host.UnsupportedHostError, match="arm64 Python"):
        host.refuse_translated(True, allow_rosetta=False)
    host.refuse_translated(True, allow_rosetta=True)
    host.refuse_translated(False, allow_rosetta=False)


@pytest.mark.macos
@pytest.mark.skipif(host.sys.platform != "darwin", reason="sysctl.proc_translated is macOS-only")
def test_this_mac_python_is_native_arm64() -> None:
    """On the Mac CI host: the real sysctl answers, and our Python is not translated."""
    assert host.read_proc_translated() in {"0", "1", None}
    assert host.is_translated() is False


def test_thread_limit_is_applied_to_torch_when_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setitem(host.sys.modules, "torch", SimpleNamespace(set_num_threads=calls.append))
    host.limit_threads_after_load(3)
    assert calls == [3]


def test_mps_cache_is_released_after_a_job_only_on_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    emptied: list[bool] = []
    fake_torch = SimpleNamespace(mps=SimpleNamespace(empty_cache=lambda: emptied.append(True)))
    monkeypatch.setitem(host.sys.modules, "torch", fake_torch)
    host.release_accelerator_cache("cpu")
    assert emptied == []
    host.release_accelerator_cache("mps")
    assert emptied == [True]


def test_pool_workers_default_to_passive_openmp_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*host.THREAD_ENV_VARS, "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    host.limit_threads_before_load(2, pool_size=1)
    assert "OMP_WAIT_POLICY" not in host.os.environ
    assert host.os.environ["OMP_NUM_THREADS"] == "2"
    host.limit_threads_before_load(1, pool_size=2)
    assert host.os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the operator's choice stands
    host.limit_threads_before_load(1, pool_size=2)
    assert host.os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
