"""`bench stream`'s arithmetic: playback stalls and the verdicts it prints against the targets."""

from __future__ import annotations

from workers.tools.bench.stream_bench import ChunkFigures, StreamBench, StreamRun
from workers.tools.bench.stream_cli import format_table


def run(arrivals: list[float], seconds: list[float], total: float) -> StreamRun:
    chunks = [
        ChunkFigures(arrival_s=a, samples=int(s * 24000), flow_s=0.1, hift_s=0.05)
        for a, s in zip(arrivals, seconds, strict=True)
    ]
    return StreamRun(chunks=chunks, total_s=total, sample_rate=24000)


def test_stalls_count_waits_after_playback_started_at_the_first_chunk() -> None:
    assert run([1.0, 1.5, 2.9], [1.0, 1.0, 1.0], 3.0).stalls() == [0.0, 0.0, 0.0]
    stalls = run([1.0, 2.5, 3.0], [1.0, 0.5, 1.0], 3.0).stalls()
    assert stalls[0] == 0.0 and abs(stalls[1] - 0.5) < 1e-9 and stalls[2] == 0.0


def test_table_says_met_and_missed_against_the_targets() -> None:
    fast = run([0.5, 1.0], [1.0, 3.0], 5.0)
    slow = run([4.0, 9.0], [1.0, 3.0], 9.0)
    bench = StreamBench(
        model="m", tokens=250, nonstream_s=5.0, runs=[fast, slow], load_average=(9.0, 10.0)
    )
    table = format_table(bench)
    assert "load average 9.0 -> 10.0" in table
    assert "target first chunk <= 3 s (every run): MISSED (worst 4.00 s)" in table
    assert "target first chunk <= 15% of non-streaming: MISSED (worst 80.0%)" in table
    assert "target total within 15% of non-streaming: MISSED (worst +80.0%)" in table
    assert "stream stays ahead of playback: no" in table
    bench.runs = [fast]
    table = format_table(bench)
    assert "(every run): met (worst 0.50 s)" in table and "ahead of playback: yes" in table


def test_chunk_table_has_the_flow_seconds_per_audio_second_and_the_recompute_run() -> None:
    bench = StreamBench(
        model="m",
        tokens=250,
        nonstream_s=5.0,
        runs=[run([0.5, 1.0], [1.0, 2.0], 5.0)],
        load_average=(1.0, 1.0),
    )
    table = format_table(bench)
    assert "flow s per audio s" in table and "without the flow cache" not in table
    assert "0.10 s   0.05   0.05 s   0.08" in table  # 0.1 s of flow for 2 s of audio
    bench.recompute = run([0.5, 1.2], [1.0, 2.0], 5.0)
    assert "chunks without the flow cache (prefix re-run per hop)" in format_table(bench)


def test_queue_jobs_are_listed_one_line_each_and_in_the_json() -> None:
    import json  # noqa: PLC0415
    from dataclasses import asdict  # noqa: PLC0415

    from workers.tools.bench.stream_bench import QueueFigures, QueueRuns  # noqa: PLC0415

    jobs = [QueueFigures(2.5, 2.0, 9.0, 4, 0.1), QueueFigures(1.5, None, 8.0, 4, 0.0)]
    bench = StreamBench(
        model="m",
        tokens=250,
        nonstream_s=5.0,
        runs=[run([0.5], [1.0], 5.0)],
        load_average=(1.0, 1.0),
        queue=QueueRuns(jobs=jobs),
    )
    table = format_table(bench)
    assert "job 1: first chunk 2.50 s after submit (2.00 s after job start" in table
    assert "job 2: first chunk 1.50 s after submit (n/a after job start" in table
    doc = json.loads(json.dumps(asdict(bench)))
    assert [job["first_from_start_s"] for job in doc["queue"]["jobs"]] == [2.0, None]


def test_the_backlog_job_is_judged_against_the_idle_worker_s_last_job() -> None:
    import json  # noqa: PLC0415
    from dataclasses import asdict  # noqa: PLC0415

    from workers.tools.bench.stream_bench import QueueFigures, QueueRuns  # noqa: PLC0415

    jobs = [QueueFigures(2.5, 2.2, 9.0, 4, 0.1), QueueFigures(1.5, 2.0, 8.0, 4, 0.0)]
    queue = QueueRuns(
        jobs=jobs,
        backlog=QueueFigures(3.4, 2.9, 12.0, 4, 0.0, {"llm": 1.5, "flow": 0.75, "hift": 0.25}),
        backlog_jobs=8,
        backlog_primer=QueueFigures(7.5, 7.25, 20.0, 4, 0.0),
    )
    bench = StreamBench("m", 250, 5.0, [run([0.5], [1.0], 5.0)], (1.0, 1.0), queue=queue)
    table = format_table(bench)
    assert "first streamed job of the voice, idle (keeps its prefix): first chunk 7.25 s" in table
    assert "behind a backlog (8 non-streamed jobs queued" in table
    assert "4 entries; model s: llm 1.50, flow 0.75, hift 0.25" in table
    assert "<= 1.5x an idle worker's (job start to first chunk): met (1.45x)" in table
    queue.backlog = QueueFigures(9.0, 4.0, 12.0, 4, 0.0)
    assert "MISSED (2.00x)" in format_table(bench)
    doc = json.loads(json.dumps(asdict(bench)))
    assert doc["queue"]["backlog"]["first_from_start_s"] == 4.0
    assert doc["queue"]["backlog_jobs"] == 8
    assert doc["queue"]["backlog_primer"]["first_from_start_s"] == 7.25
