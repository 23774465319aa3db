"""`cosyq-worker bench queue --via http` runs end to end (fast test engine, few jobs) and its
JSON holds every series it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.doubles.harness import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_bench_queue_via_http_measures_both_paths() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    command = [
        sys.executable,
        "-m",
        "workers.cli",
        "bench",
        "queue",
        "--via",
        "http",
        "--engine",
        "tests.doubles.engines:fast",
        "--jobs",
        "6",
        "--e2e-jobs",
        "3",
        "--concurrency",
        "2",
        "--json",
    ]
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=220, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    for name in ("submit_direct", "submit_http", "submit_http_concurrent"):
        assert len(doc[name]["ms"]) == 6 and all(ms > 0 for ms in doc[name]["ms"])
    for name in ("direct", "via_http"):
        assert len(doc[name]["wall"]["ms"]) == 3 and len(doc[name]["job_ms"]) == 3
        assert all(
            w >= j for w, j in zip(doc[name]["wall"]["ms"], doc[name]["job_ms"], strict=True)
        )
    assert isinstance(doc["added_ms"], float)


def test_bench_queue_refuses_nonsense_counts() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "bench", "queue", "--via", "http", "--jobs", "0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "must be >= 1" in done.stderr
