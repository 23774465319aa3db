"""The GPU check's plumbing on the CPU: its plan, its JSON (the issue's field names), and a
short real run of its runner."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from workers.tools.gpu_check.__main__ import main
from workers.tools.gpu_check.plan import CheckOptions, plan
from workers.tools.gpu_check.summary import StepResult, summarize
from workers.tools.reference.check import REQUIRED_FILES

ISSUE_FIELDS = (
    "device",
    "torch",
    "dtype",
    "batch_audio_s_per_wall_s",
    "pool_audio_s_per_wall_s",
    "vs_upstream_tts",
    "stream_first_chunk_s",
    "stream_first_chunk_s_c8",
    "recycle_ready_s",
    "snr_db",
)


def test_a_full_run_plans_every_measurement_of_the_issue(tmp_path: Path) -> None:
    options = CheckOptions(
        reference=tmp_path / "ref", upstream=tmp_path / "cvup", work=tmp_path, checkout=tmp_path
    )
    steps = {step.name: step for step in plan(options)}
    assert list(steps) == [  # what a run cut short must have comes first
        "check_reference",
        "cuda_tests",
        "bench_bf16",
        "batch",
        "upstream_ckpt",
        "upstream",
        "stream",
        "pool",
        "recycle",
        "bench_fp16",
        "cv3_bench",
        "cv3_batch",
    ]
    assert "llm,hift,features" in steps["check_reference"].argv  # no flow.pt carried
    cv3 = steps["cv3_batch"].argv
    assert (
        cv3[cv3.index("--family") + 1] == "cosyvoice3"
        and "--compare-fp32" in steps["cv3_bench"].argv
    )
    assert cv3[cv3.index("--batch-sizes") + 1] == "1,8,32,64"
    assert steps["check_reference"].argv[-2:] == ("--device", "cuda")
    batch = steps["batch"].argv
    assert batch[batch.index("--batch-sizes") + 1] == "1,8,32,64,128"
    assert "full-random" in batch and "--compare-fp32" in steps["bench_fp16"].argv
    assert ("COSYQ_DEVICE", "cuda") in steps["recycle"].env
    assert steps["pool"].env == (("COSYQ_COMPILE_CACHE_DIR", str(tmp_path / "inductor")),)
    assert steps["upstream"].cwd == tmp_path / "cvup"
    assert sum(step.timeout_s for step in steps.values()) > 480  # the budget cuts, not the sum


def _step(name: str, data: object, rc: int | None = 0) -> StepResult:
    return StepResult(name, rc, 1.0, data)


def test_the_json_carries_the_issue_fields_and_verdicts() -> None:
    steps = {
        "bench_bf16": _step(
            "bench_bf16",
            {"precision_vs_fp32": {"dtype": "bf16", "flow_mel_db": 41.0, "hift_wav_db": 29.0}},
        ),
        "batch": _step(
            "batch",
            {"rows": [{"batch_size": 1, "throughput": 9.0}, {"batch_size": 64, "throughput": 120}]},
        ),
        "stream": _step("stream", {"queue": {"jobs": [{"first_from_start_s": 0.12}]}, "runs": []}),
        "pool": _step("pool", {"audio_s_per_wall_s": 50.0, "stream": {"first_chunk_max_s": 0.5}}),
        "recycle": _step("recycle", None, rc=None),  # timed out: no figure, never a guess
    }
    upstream = {"results": {"fp16": {"concurrency": {"1": {"audio_s_per_wall_s": 4.0}}}}}
    summary = summarize(steps, {"device": "cuda", "torch": "2.11.0"}, upstream)
    assert all(field in summary for field in ISSUE_FIELDS)
    assert summary["dtype"] == "bf16" and summary["best_batch_size"] == 64
    assert summary["batch_audio_s_per_wall_s"] == 120
    assert summary["vs_upstream_tts"] == 30.0
    assert summary["stream_first_chunk_s"] == 0.12
    assert summary["recycle_ready_s"] is None
    assert summary["cosyvoice3"] is None  # its steps did not run: no block, never zeros
    cv3 = {"summary": {"rtf": 0.05}, "precision_vs_fp32": {"flow_mel_db": 38.0, "x_db": None}}
    steps["cv3_bench"] = _step("cv3_bench", cv3)
    steps["cv3_batch"] = _step("cv3_batch", None, rc=1)  # failed: its figure is null
    assert summarize(steps, {}, None)["cosyvoice3"] == {
        "rtf": 0.05,
        "snr_db": {"flow_mel_db": 38.0},
        "batch_audio_s_per_wall_s": None,
        "best_batch_size": None,
    }
    steps["pool"] = _step("pool", {"audio_s_per_wall_s": 70, "recycle_ready_s": [31.0, 6.5]})
    assert summarize(steps, {}, None)["recycle_ready_s"] == 6.5  # the start from the cache
    targets = summary["targets"]
    assert targets["batch_audio_s_per_wall_s"]["met"] is True
    assert targets["pool_audio_s_per_wall_s"]["met"] is False
    assert targets["stream_first_chunk_s_c8"]["met"] is False
    assert targets["hift_wav_snr_db"]["met"] is False
    assert targets["recycle_ready_s"]["met"] is None
    json.dumps(summary)  # all of it serialisable


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_short_real_run_writes_its_json(
    tmp_path: Path, reference_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runner itself on the CPU: the tiny model and the reference check run for real;
    a step that fails is recorded with its status and the run says so. The set is carried as
    the GPU run carries it: without flow.pt."""
    carried = tmp_path / "reference"
    carried.mkdir()
    for name in REQUIRED_FILES:
        if name != "flow.pt":
            shutil.copy(reference_dir / name, carried / name)
    out = tmp_path / "out"
    heavy = "bench_bf16,batch,stream,pool,recycle,cv3_bench,cv3_batch"
    args = ["--device", "cpu", "--quick", "--work", str(tmp_path / "work"), "--out", str(out)]
    rc = main([*args, "--reference", str(carried), "--dtypes", "bf16", "--skip", heavy])
    assert rc == 0
    summary = json.loads((out / "gpu-check.json").read_text())
    assert summary["device"] == "cpu" and summary["check_reference_passed"] is True
    assert set(summary["steps"]) == {"tiny_model", "check_reference"}
    assert summary["batch_audio_s_per_wall_s"] is None
    assert "==== check_reference rc=0" in (out / "gpu-check.log").read_text()
    missing = tmp_path / "not-a-set"
    missing.mkdir()
    # the tiny model is written above (its own process, ~3.5 CPU s): this run checks the failing
    # step alone
    again = f"{heavy},tiny_model"
    rc = main([*args, "--reference", str(missing), "--dtypes", "bf16", "--skip", again])
    assert rc == 1
    failed = json.loads((out / "gpu-check.json").read_text())
    assert failed["check_reference_passed"] is False and set(failed["steps"]) == {"check_reference"}
    assert "steps failed or not run: check_reference" in capsys.readouterr().out
