"""What makes two dumps of one release differ, taken out: scripts/wire_fixtures.py's normaliser.

A dump's times, TTLs, measured durations and process names change at each run; the rest (ids
from a counter, the requests, the results' audio) does not. `Normaliser` rewrites the changing
parts so that two runs of one release write byte-identical fixtures, keeping what they mean:

- an instant of the run (ISO 8601, Unix seconds with or without a fraction, Unix milliseconds
  and stream ids) becomes `EPOCH` plus its rank among the run's instants in milliseconds, in
  the form and precision it had: order kept (started before ended, stream ids increasing),
  whole seconds all `EPOCH`, minute buckets (`cosyq:throughput:<minute>`) `EPOCH // 60`;
- an instant after the dump (an expiry score, a deadline) becomes the normalised dump time
  (`EPOCH + 1`) plus its distance from the dump rounded up to a whole minute, as a TTL is: a
  key's TTL, read at the dump, rounded up to a whole minute (1 s under a minute). Both hold
  for a run shorter than a minute and durations of whole minutes (every TTL cosyq sets);
- measured durations (stage timings, RTF, a file's inode and mtime) become `MEASURED`;
- a worker's name (`<host>.<pid>.<hex>`) becomes `worker-<n>` (n: its first appearance), its
  host `host` and its pid `0`.

tests/doubles/wire.py reads `EPOCH` to put a fixture's instants back at the time it is loaded.
Self-contained (no cosyq import): it runs beside any release's code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

EPOCH = 1009843200  # 2002-01-01T00:00:00Z: a whole minute, 10 digits as every run's instants
AFTER_RUN = EPOCH + 1  # the normalised dump time: a run's ranks stay under 1,000 ms
MEASURED = 0.001  # every measured duration's normalised value (not 0: a reader may divide)
MINUTE_S = 60
# A fraction of a second in an ISO time: any number of digits, kept as written.
ISO = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|\+00:00)")
# Unix seconds (10 digits, optional fraction or exponent-free float) and milliseconds (13 digits,
# as a stream id's first part); not inside a longer run of digits, letters or a hex id.
# A request's seed (any 32-bit number: 1 in ~120 is in a year of Unix seconds) is no time.
NOT_A_SEED = "".join(
    rf"(?<!seed{quote}:{space})" for quote in ('"', r'\\"', r'\\\\\\"') for space in ("", " ")
)
UNIX = re.compile(rf"(?<![\w.]){NOT_A_SEED}(\d{{10}}|\d{{13}})(\.\d+)?(?![\w.])")
# A storage key's date folder (`<tenant>/2026/12/08/<job id>.wav`): the run's day, EPOCH's.
DATE_FOLDER = re.compile(r"(?<![\w])(\d{4})/(\d\d)/(\d\d)/")
MINUTE_KEY = re.compile(r"^(cosyq:throughput:(?:[^:]+:)?)(\d{8})$")
# Durations a run measures (a result's `timings`, its RTF, the quality check's own time), a
# process's memory, an audio note's inode and mtime; and what names a process.
MEASURED_KEYS = (
    "encode_s|first_chunk_s|flow_s|frontend_s|hift_s|join_s|llm_s|measure_s|queue_wait_s|"
    "store_s|total_s|rtf|inode|mtime_ns"
)
NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
MEASURED_FIELD = re.compile(rf'(\\*"(?:{MEASURED_KEYS})\\*"\s*:\s*(?:\\*")?)({NUMBER})')
PROCESS_FIELD = re.compile(r'(\\*"(pid|worker_pid|host|rss_mb)\\*"\s*:\s*(\\*")?)([^"\\,}]*)')
PROCESS_VALUES = {"pid": "0", "worker_pid": "0", "host": "host", "rss_mb": "0"}


class Normaliser:
    """One dump's normaliser: `start` and `end` (Unix seconds, the server's clock) bound the
    run; `host` is the machine's name as worker names start with it."""

    def __init__(self, *, start: float, end: float, host: str) -> None:
        self.start, self.end = start - 1, end + 1  # whole seconds written either side
        self.worker = re.compile(rf"{re.escape(host)}\.\d+\.[0-9a-f]{{4}}")
        self.host = host
        self.workers: dict[str, str] = {}
        self.ranks: dict[float, int] = {}

    # -- the run's instants ---------------------------------------------------------------------

    def learn(self, texts: Iterable[str]) -> None:
        """Rank every instant of the run found in `texts` (call once, with every text)."""
        # whole seconds (no fraction written) are not ranked, nor milliseconds: a stream's ids
        # are numbered within their stream (`stream_ids`), not against other clocks' instants
        seen: set[float] = set()
        for text in texts:
            seen.update(_iso_seconds(m) for m in ISO.finditer(text) if m.group(2))
            seen.update(
                _unix_seconds(m)
                for m in UNIX.finditer(text)
                if m.group(2) and len(m.group(1)) == 10
            )
        run = sorted(t for t in seen if self.start <= t <= self.end)
        self.ranks = {t: rank for rank, t in enumerate(run)}
        if len(run) >= 1000:
            raise ValueError(f"{len(run)} instants: ranks in ms would pass a second")

    def instant(self, t: float) -> float | None:
        """`t` normalised, or None when `t` is no instant of the run nor after it."""
        if self.start <= t <= self.end:
            rank = self.ranks.get(t)
            return float(EPOCH) if rank is None else EPOCH + rank / 1000
        if self.end < t < self.end + 400 * 86400:
            return float(AFTER_RUN + ttl_bucket_s(t - self.end))
        return None

    def text(self, text: str) -> str:
        text = self.worker.sub(self._worker, text)
        text = DATE_FOLDER.sub(self._date, text)
        text = ISO.sub(self._iso, text)
        text = UNIX.sub(self._unix, text)
        text = MEASURED_FIELD.sub(lambda m: m.group(1) + repr(MEASURED), text)
        return PROCESS_FIELD.sub(lambda m: m.group(1) + PROCESS_VALUES[m.group(2)], text)

    def field(self, name: str, value: str) -> str:
        """A hash field's normalised value (a worker-stats hash's pid and host are fields)."""
        return PROCESS_VALUES.get(name, value)

    def key(self, key: str) -> str:
        match = MINUTE_KEY.match(key)
        if match and self.start // MINUTE_S <= int(match.group(2)) <= self.end // MINUTE_S:
            return f"{match.group(1)}{EPOCH // MINUTE_S}"
        return self.text(key)

    def score(self, score: float) -> float:
        normalised = self.instant(round(score, 6))
        return score if normalised is None else normalised

    def _worker(self, match: re.Match[str]) -> str:
        return self.workers.setdefault(match.group(0), f"worker-{len(self.workers) + 1}")

    def _date(self, match: re.Match[str]) -> str:
        day = datetime(*map(int, match.groups()), tzinfo=UTC).timestamp()
        if self.start - 86400 < day <= self.end:
            return datetime.fromtimestamp(EPOCH, UTC).strftime("%Y/%m/%d/")
        return match.group(0)

    def _iso(self, match: re.Match[str]) -> str:
        t = self.instant(_iso_seconds(match))
        if t is None:
            return match.group(0)
        fraction = match.group(2) or ""
        written = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        if fraction:
            written += f"{t - math.floor(t):.{len(fraction) - 1}f}"[1:]
        return written + match.group(3)

    def _unix(self, match: re.Match[str]) -> str:
        t = self.instant(_unix_seconds(match))
        if t is None:
            return match.group(0)
        if len(match.group(1)) == 13:  # milliseconds
            return str(round(t * 1000)) + (match.group(2) or "")
        return f"{t:.6f}" if match.group(2) else str(math.floor(t))  # str(float)'s digits vary


def stream_ids(ids: list[str]) -> dict[str, str]:
    """A stream's entry ids numbered in their order from EPOCH's millisecond: the n-th entry
    `<EPOCH ms + n>-0`. XADDs a millisecond apart or in one are alike, so two runs agree."""
    return {old: f"{EPOCH * 1000 + n}-0" for n, old in enumerate(ids, start=1)}


def group_position(ids: dict[str, str], delivered: str) -> str:
    """A consumer group's last delivered id in the renumbered stream: the id of the last entry
    at or before it (0-0 when none)."""

    def key(entry_id: str) -> tuple[int, int]:
        ms, _, seq = entry_id.partition("-")
        return int(ms), int(seq or 0)

    before = [new for old, new in ids.items() if key(old) <= key(delivered)]
    return before[-1] if before else "0-0"


def ttl_bucket_s(seconds: float) -> int:
    """A remaining time read at the dump, rounded up: to a whole minute, 1 s under one."""
    if seconds < MINUTE_S:
        return max(1, math.ceil(seconds))
    return math.ceil(seconds / MINUTE_S) * MINUTE_S


def ttl_bucket_ms(ttl_ms: int | None) -> int | None:
    return None if ttl_ms is None else ttl_bucket_s(ttl_ms / 1000) * 1000


def _iso_seconds(match: re.Match[str]) -> float:
    whole = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return round(whole.timestamp() + float("0" + (match.group(2) or "")), 6)


def _unix_seconds(match: re.Match[str]) -> float:
    """In microseconds: one instant written as a float (7 digits) and as ISO (6) is one."""
    whole = int(match.group(1))
    if len(match.group(1)) == 13:
        return whole / 1000
    return round(whole + float("0" + (match.group(2) or "")), 6)


def shift_times(text: str, by_s: float, *, low: float, high: float) -> str:
    """Every instant in [low, high] of `text` moved by `by_s` seconds, in its form (the loader
    puts a normalised fixture's instants at the time it is loaded)."""

    def moved(seconds: float, write: Callable[[float], str], fallback: str) -> str:
        return write(seconds + by_s) if low <= seconds <= high else fallback

    def iso(match: re.Match[str]) -> str:
        fraction = match.group(2) or ""

        def write(t: float) -> str:
            whole = math.floor(t)
            out = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            if fraction:
                out += f"{t - whole:.{len(fraction) - 1}f}"[1:]
            return out + match.group(3)

        return moved(_iso_seconds(match), write, match.group(0))

    def unix(match: re.Match[str]) -> str:
        fraction = match.group(2) or ""

        def write(t: float) -> str:
            if len(match.group(1)) == 13:
                return str(round(t * 1000)) + fraction
            return f"{t:.6f}" if fraction else str(math.floor(t))

        return moved(_unix_seconds(match), write, match.group(0))

    return UNIX.sub(unix, ISO.sub(iso, text))
