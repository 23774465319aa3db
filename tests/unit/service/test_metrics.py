"""Metrics pieces: folding a dead child's files, the batch histogram, the deploy/ examples."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import yaml
from prometheus_client import REGISTRY
from prometheus_client.multiprocess import MultiProcessCollector

from workers.service import metrics

REPO_ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS_DIR = REPO_ROOT / "deploy" / "prometheus"

CHILD = """
import os, sys
from workers.service import metrics
metrics.record_job("cosyq-default", "finished", 0.2)
metrics.record_stages({"llm_s": 0.1}, 1.5)
metrics.set_worker_state("idle")
print(os.getpid())
"""


def run_child(folder: Path) -> int:
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(folder))
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, cwd=REPO_ROOT, capture_output=True, check=True
    )
    return int(done.stdout.decode().strip())


def totals(folder: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    files = [str(path) for path in folder.glob("*.db")]
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in MultiProcessCollector.merge(files)
        for s in family.samples
    }


def test_folding_dead_children_keeps_their_totals_and_drops_their_files(tmp_path: Path) -> None:
    lock = threading.Lock()
    first, second = run_child(tmp_path), run_child(tmp_path)
    before = totals(tmp_path)
    finished = ("cosyq_jobs_total", (("outcome", "finished"), ("queue", "cosyq-default")))
    assert before[finished] == 2
    metrics.fold_dead_process(str(tmp_path), first, lock)
    metrics.fold_dead_process(str(tmp_path), second, lock)
    after = totals(tmp_path)
    assert after[finished] == 2
    assert after[("cosyq_audio_seconds_total", ())] == 3.0
    assert after[("cosyq_stage_seconds_count", (("stage", "llm"),))] == 2
    assert not any(key[0] == "cosyq_workers" for key in after)  # live gauges went with them
    names = sorted(path.name for path in tmp_path.glob("*.db"))
    assert names == ["counter_archive.db", "histogram_archive.db"]


def test_record_batch_observes_the_batch_size_histogram() -> None:
    def count(le: str) -> float:
        return REGISTRY.get_sample_value("cosyq_batch_size_bucket", {"le": le}) or 0.0

    below, at = count("3.0"), count("4.0")
    metrics.record_batch(4)
    assert count("3.0") == below
    assert count("4.0") == at + 1


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported_series() -> set[str]:
    """Series names of every cosyq family (labelled ones have no samples until used)."""
    names = set()
    for family in REGISTRY.collect():
        if family.name.startswith("cosyq_"):
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names | {"cosyq_queue_depth"}  # read from Redis at scrape time


def test_the_example_alerts_are_the_three_asked_for_and_name_real_metrics() -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    for rule_file in config["rule_files"]:
        assert (PROMETHEUS_DIR / rule_file).is_file()
    assert config["scrape_configs"][0]["static_configs"][0]["targets"]
    rules = yaml.safe_load((PROMETHEUS_DIR / "cosyq-alerts.yml").read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert [a["alert"] for a in alerts] == [
        "CosyqQueueGrowing",
        "CosyqNoReadyWorker",
        "CosyqHighFailureRatio",
    ]
    for metrics_state in ("idle", "busy", "retiring"):
        assert metrics_state in metrics.WORKER_STATES
    known = exported_series()
    for alert in alerts:
        used = set(re.findall(r"cosyq_[a-z_]+", alert["expr"]))
        assert used and used <= known, (alert["alert"], used - known)
        assert alert["for"] and alert["annotations"]["summary"]
