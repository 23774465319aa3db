"""`cosyq-worker bench`: runs on the tiny model; the full-random writer at a reduced size; FULL
configs from its files equal the reference set's (checked on plain data, nothing materialised)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workers.cli import main
from workers.engine.cpu_features import HostCPU
from workers.model.directory import QWEN_DIR, YAML_FILE, ModelDirectory
from workers.model.flow.config import FlowConfig
from workers.model.loader import ModelConfigs, load_model
from workers.tools.bench.cli import set_omp_wait_policy
from workers.tools.bench.engine_bench import BenchOptions, BenchResult, RunFigures
from workers.tools.bench.precision import snr_db
from workers.tools.bench.report import format_report, verdict
from workers.tools.fixtures.full_random import FULL_SPEC, is_written, write_random_model
from workers.tools.fixtures.tiny_config import TinySpec, qwen2_config, render_yaml
from workers.tools.reference.configs import (
    flow_config_from_reference,
    hift_config_from_reference,
    llm_config_from_reference,
)
from workers.tools.reference.parity import ReferenceSet


def test_bench_prints_the_table_on_the_tiny_model(capsys: pytest.CaptureFixture[str]) -> None:
    """The table's rows; the floors (~8 of this test's 11 CPU s) are measured and checked by
    test_bench_json_has_every_figure..., and printed in the text table by test_bf16_against..."""
    argv = ["bench", "--runs", "2", "--threads", "1", "--text", "Hello.", "--omp-wait-policy"]
    assert main([*argv, "inherit", "--no-floors"]) == 0
    out = capsys.readouterr().out
    assert "cosyq-worker bench: tiny" in out and "torch cpu fp32, 1 threads" in out
    for row in ("model load s", "first inference s", "mean inference s", "p95 inference s"):
        assert row in out
    for row in ("audio s", "RTF (mean / audio)", "peak RSS GB", "tokens/s", "HiFT"):
        assert row in out
    assert "(targets: fp32" not in out  # the targets are for the full-size model


def test_worker_cli_parser_loads_no_torch() -> None:
    """`cosyq-worker --help` stays instant, and bench can still set OMP_WAIT_POLICY in time."""
    code = "import sys, workers.cli; workers.cli.build_parser(); print('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_wait_policy_must_be_set_before_torch_loads(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert set_omp_wait_policy("active") == "ACTIVE"  # already in force: fine
    assert set_omp_wait_policy("passive") == "ACTIVE"  # torch is loaded in this process
    assert "torch was loaded before OMP_WAIT_POLICY=PASSIVE" in capsys.readouterr().err
    assert set_omp_wait_policy("inherit") == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert set_omp_wait_policy("inherit") == "(unset)"


def test_forced_tokens_and_targets_table() -> None:
    figures = RunFigures(
        wall_s=2.0,
        audio_s=4.0,
        stages={"frontend": 0.01, "llm": 1.0, "flow": 0.8, "hift": 0.19},
        speech_tokens=100,
        pieces=1,
        first_token_s=0.109,
    )
    assert figures.ms_per_token == pytest.approx(9.0)  # (1.0 - 0.109) s / 99 tokens
    result = BenchResult(
        options=BenchOptions(config="full-random"),
        model="model",
        device="cpu",
        load_s=1.0,
        voice_s=0.1,
        prefill_positions=42,
        rss_after_load_gb=0.5,
        peak_rss_gb=2.7,
        first=figures,
        runs=(figures, figures),
        load_average=(0.5, 1.5),
        omp_wait_policy="PASSIVE",
        host=HostCPU("Test CPU", "x86_64", ("avx2",), 2),
        precisions={"llm": "fp32", "flow": "fp32", "hift": "fp32"},
    )
    report = format_report(result)
    assert "100 speech tokens forced" in report
    assert "CPU: Test CPU (x86_64, 2 cores); ISA: avx2" in report
    assert "OMP_WAIT_POLICY=PASSIVE; load average 0.50 before, 1.50 after" in report
    assert "whole chain RTF, 4 s utterance" in report and "met, 79% under" in report
    assert verdict(5.5, 5.0) == "missed, 10% over"


def test_random_model_writer_at_a_reduced_size(tmp_path: Path) -> None:
    spec = TinySpec()
    root = tmp_path / "random"
    directory = write_random_model(root, spec=spec, seed=3, hash_cache_dir=tmp_path / "h")
    assert is_written(root, spec, 3) and not is_written(root, spec, 4)
    assert not is_written(root, FULL_SPEC, 3)
    assert list((tmp_path / "h").iterdir())  # hashes cached as a first worker would
    model = load_model(directory.root, hash_cache_dir=tmp_path / "h")  # strict keys and shapes
    assert model.configs.llm.backbone.hidden_size == spec.llm_hidden
    up = model.llm.backbone.layers[0].mlp.up_proj.weight  # N(0, 0.02), not torch's defaults
    assert float(up.std()) == pytest.approx(0.02, rel=0.1)


def test_full_spec_describes_the_real_model(tmp_path: Path, reference_dir: Path) -> None:
    (tmp_path / YAML_FILE).write_text(render_yaml(FULL_SPEC))
    (tmp_path / QWEN_DIR).mkdir()
    (tmp_path / QWEN_DIR / "config.json").write_text(json.dumps(qwen2_config(FULL_SPEC)))
    configs = ModelConfigs.from_directory(ModelDirectory(tmp_path))
    reference = ReferenceSet(reference_dir).config
    assert configs.llm == llm_config_from_reference(reference, "full")
    assert configs.flow == flow_config_from_reference(reference, "full") == FlowConfig()
    assert configs.hift == hift_config_from_reference(reference, "full")


def test_snr() -> None:
    signal = np.sin(np.linspace(0, 20, 1000))
    assert snr_db(signal, signal) == float("inf")
    assert snr_db(signal, signal * 1.1) == pytest.approx(20.0)  # error = 10% of the signal
    assert snr_db(signal, np.zeros(1000)) == pytest.approx(0.0)


def test_bf16_against_fp32_on_the_tiny_model(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--runs", "1", "--threads", "1", "--dtype", "bf16", "--compare-fp32"]
    assert main([*argv, "--text", "Hello.", "--omp-wait-policy", "inherit"]) == 0
    out = capsys.readouterr().out
    assert "bf16 vs fp32, SNR dB" in out
    lines = [line for line in out.splitlines() if "(same" in line or "(centred)" in line]
    values = [float(line.split()[-1]) for line in lines]
    assert len(values) == 5 and all(0.0 < v < 100.0 for v in values)  # close, not identical


def test_cosyvoice3_bf16_against_fp32_with_its_system_prompt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """CosyVoice 3's LLM needs <|endofprompt|> in its prompt: the check prefills the prompt a
    job's mode gives (it once prefilled none and failed). Its causal HiFT draws no noise, so
    the decoder-alone row is n/a."""
    argv = ["bench", "--family", "cosyvoice3", "--runs", "1", "--threads", "1", "--dtype", "bf16"]
    assert main([*argv, "--compare-fp32", "--text", "Hello.", "--no-floors"]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if "(same" in line or "(centred)" in line]
    decoder = next(line for line in lines if line.startswith("HiFT decoder"))
    assert decoder.split()[-1] == "n/a"
    values = [float(line.split()[-1]) for line in lines if line is not decoder]
    assert len(values) == 4 and all(0.0 < v < 100.0 for v in values)  # close, not identical


def test_int8_llm_against_fp32_on_the_tiny_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["bench", "--runs", "1", "--threads", "1", "--llm-precision", "int8", "--compare-fp32"]
    argv += ["--text", "Hello.", "--no-floors", "--cache-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "precision per stage: llm int8, flow fp32" in out
    assert "fp32, LLM int8 vs fp32, SNR dB" in out
    first = next(line for line in out.splitlines() if line.startswith("LLM first-step"))
    assert 30.0 < float(first.split()[-1]) < 100.0  # close to fp32, not identical
    agreeing = [line for line in out.splitlines() if "sampled tokens agreeing" in line]
    assert [("/ 200" in line, line.split(", ")[-1].split(";")[0]) for line in agreeing] == [
        (True, "teacher-forced"),
        (True, "free-running"),
    ]
    assert any(line.startswith("nucleus overlap 1-TV") for line in out.splitlines())
    assert [p.suffix for p in (tmp_path / "onnx").iterdir()] == [".onnx"]  # the graph kept


def test_bench_json_has_every_figure_the_cpu_and_each_stage_beside_its_floor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "--runs", "1", "--threads", "1", "--text", "Hello.", "--tokens", "4"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cpu"]["model"] and isinstance(doc["cpu"]["flags"], list)
    assert doc["precisions"]["llm"] == "fp32" and doc["precisions"]["hift_source_stft"] == "fp32"
    summary = doc["summary"]
    for key in ("rtf", "ms_per_token", "flow_s", "hift_s", "load_s", "peak_rss_gb", "mean_s"):
        assert summary[key] > 0, key
    floors = doc["floors"]
    assert floors["bandwidth_gbs"] > 0 and floors["gemm_gflops"]["fp32"] > 0
    assert floors["flow_gflop"] > 0 and 0 < floors["flow_ops"]["matmul"] < 1
    for stage in ("llm", "flow", "hift"):
        entry = doc["stages"][stage]
        assert entry["precision"] == "fp32" and entry["floor_s"] > 0
        assert entry["x_floor"] == pytest.approx(
            (entry["s"] - (entry["first_token_s"] if stage == "llm" else 0)) / entry["floor_s"]
        )
    assert doc["stages"]["llm"]["floor_ms_per_token"] == pytest.approx(
        1e3 * floors["llm_bytes_per_step"] / (floors["bandwidth_gbs"] * 1e9)
    )
    assert len(doc["runs"]) == 1 and doc["runs"][0]["speech_tokens"] == 4
    quality, run = doc["stages"]["quality"], doc["runs"][0]
    assert quality["s"] == pytest.approx(run["quality_s"]) and run["quality_s"] > 0
    assert quality["share"] == pytest.approx(run["quality_s"] / run["wall_s"])
    assert quality["target_share"] == 0.01 and quality["met"] == (quality["share"] < 0.01)


def test_each_stage_bench_is_a_bench_subcommand_on_the_shared_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from workers.cli import build_parser  # noqa: PLC0415
    from workers.tools.bench import stage_cli  # noqa: PLC0415

    parser = build_parser()
    for stage, handler in (("llm", stage_cli.run_llm), ("flow", stage_cli.run_flow)):
        args = parser.parse_args(["bench", stage, "--threads", "1", "--tokens", "7"])
        assert args.handler is handler and args.threads == 1 and args.tokens == 7
        assert args.runs == 3 and args.omp_wait_policy == "inherit"
    args = parser.parse_args(["bench", "hift", "--frames", "20", "--runs", "1"])
    assert args.handler is stage_cli.run_hift and (args.frames, args.runs) == (20, 1)
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "flow", "--dtype", "fp16"])  # bf16 is CosyVoice 3's only
    assert "invalid choice: 'fp16'" in capsys.readouterr().err
