"""The soak's inputs read back (the pool's /metrics and log) and its printed table."""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 5.0
STALL_S = 180.0  # no job ended for this long: the rest count as lost
MIB = 1024 * 1024


@dataclass(frozen=True)
class SoakOptions:
    jobs: int = 1000
    pool: int = 2
    max_jobs: int = 50
    bad_every: int = 20  # every 20th job is bad: 5%
    seed: int = 0
    stall_s: float = STALL_S


@dataclass
class ProcessMemory:
    """One worker process: its jobs and RSS samples (wall time, bytes)."""

    pid: int
    job_ends: list[float] = field(default_factory=list)
    samples: list[tuple[float, float]] = field(default_factory=list)

    def rss_after(self, moment: float) -> float | None:
        later = [rss for at, rss in self.samples if at >= moment]
        if later:
            return later[0] / MIB
        return self.samples[-1][1] / MIB if self.samples else None

    @property
    def first_job_mb(self) -> float | None:
        return self.rss_after(min(self.job_ends)) if self.job_ends else None

    @property
    def last_job_mb(self) -> float | None:
        return self.rss_after(max(self.job_ends)) if self.job_ends else None

    @property
    def max_mb(self) -> float:
        return max((rss for _, rss in self.samples), default=0.0) / MIB


@dataclass
class SoakReport:
    options: SoakOptions
    jobs: int
    bad: int
    finished: int
    failed: int
    lost: int
    recycles: int
    crashes: int
    wall_s: float
    audio_s: float
    processes: list[ProcessMemory]
    unexpected: list[str]  # good jobs that failed, bad ones that finished: with reasons
    load_average: tuple[float, float]  # 1-minute load before and after

    @property
    def max_rss_mb(self) -> float:
        return max((p.max_mb for p in self.processes), default=0.0)

    def as_json(self) -> dict[str, object]:
        """The keys `--json` prints (scripts read them)."""
        return {
            "jobs": self.jobs,
            "bad": self.bad,
            "finished": self.finished,
            "failed": self.failed,
            "lost": self.lost,
            "recycles": self.recycles,
            "max_rss_mb": round(self.max_rss_mb, 1),
            "wall_s": round(self.wall_s, 2),
        }


def scrape_rss(address: str) -> dict[int, float]:
    """pid -> RSS bytes from `cosyq_worker_rss_bytes`; empty while the endpoint is not up."""
    try:
        with urllib.request.urlopen(address, timeout=SCRAPE_TIMEOUT_S) as response:
            text = response.read().decode("utf-8")
    except OSError:
        return {}
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "cosyq_worker_rss_bytes" and "pid" in sample.labels:
                out[int(sample.labels["pid"])] = float(sample.value)
    return out


def pool_events(log_path: Path) -> list[dict[str, Any]]:
    """The pool's JSON log lines (its workers write to the same file)."""
    events = []
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def format_report(report: SoakReport) -> str:
    o = report.options
    rows = [
        f"soak: {report.jobs} jobs ({report.bad} bad on purpose), pool of {o.pool}, "
        f"COSYQ_MAX_JOBS={o.max_jobs} (+10% jitter), tiny model, private redis-server",
        f"load average {report.load_average[0]:.2f} before, {report.load_average[1]:.2f} after, "
        f"on {os.cpu_count()} CPUs",
        "",
        f"{'finished':<28}{report.finished:>8}",
        f"{'failed (must equal bad)':<28}{report.failed:>8}   bad: {report.bad}",
        f"{'lost (must be 0)':<28}{report.lost:>8}",
        f"{'recycles':<28}{report.recycles:>8}   crashes: {report.crashes}",
        f"{'wall s':<28}{report.wall_s:>8.1f}",
        f"{'jobs/s (finished)':<28}{report.finished / max(report.wall_s, 1e-9):>8.2f}",
        f"{'audio s per wall s':<28}{report.audio_s / max(report.wall_s, 1e-9):>8.2f}",
        f"{'max RSS MB':<28}{report.max_rss_mb:>8.0f}",
        "",
        "worker process RSS (MB, sampled from /metrics each second):",
        f"{'pid':>8} {'jobs':>5} {'first job':>10} {'last job':>9} {'max':>6}",
    ]
    for process in report.processes:
        if not process.job_ends:
            continue
        rows.append(
            f"{process.pid:>8} {len(process.job_ends):>5} {_mb(process.first_job_mb):>10} "
            f"{_mb(process.last_job_mb):>9} {process.max_mb:>6.0f}"
        )
    if report.unexpected:
        rows += ["", f"unexpected outcomes ({len(report.unexpected)}):"]
        rows += [f"  {line}" for line in report.unexpected[:20]]
    return "\n".join(rows)
