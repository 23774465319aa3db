"""A short `cosyq-worker bench soak`: varied jobs through a recycling pool, none lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
KEYS = ["jobs", "bad", "finished", "failed", "lost", "recycles", "max_rss_mb", "wall_s"]


@pytest.mark.timeout(600)
def test_a_short_soak_loses_nothing_and_fails_only_the_bad_jobs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env.update(PYTHONPATH=str(REPO_ROOT), TMPDIR=str(scratch))
    # One slot, so each retirement is granted at once: 16 jobs on a budget of 6 recycle twice
    # (12 good ones alone fill two budgets); every 4th is bad, so each of the 4 bad kinds once.
    command = [sys.executable, "-m", "workers.cli", "bench", "soak", "--jobs", "16",
               "--pool", "1", "--max-jobs", "6", "--bad-every", "4", "--json"]  # fmt: skip
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False, timeout=580
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    summary = json.loads(done.stdout)
    assert list(summary) == KEYS
    assert summary["jobs"] == 16 and summary["bad"] == 4  # one of each bad kind
    assert summary["failed"] == summary["bad"]
    assert summary["finished"] == 12 and summary["lost"] == 0
    assert summary["recycles"] >= 2
    assert 50 < summary["max_rss_mb"] < 8192
    assert summary["wall_s"] > 0
    assert not list(scratch.glob("cosyq-soak-*"))  # its scratch folder is removed
