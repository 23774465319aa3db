"""`COSYQ_LLM_PRECISION`: the setting, the choice (auto's table), and an int8 engine end to end."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import torch
from structlog.testing import capture_logs

from shared.errors import ModelLoadError, SettingsError
from shared.settings import load_settings
from workers.engine.api import SynthesisInput
from workers.engine.batch_session import PipelineBatchSession
from workers.engine.cpu_features import HostCPU
from workers.engine.llm_precision import (
    MEASURED,
    Int8Measurement,
    choose_llm_precision,
    host_class,
)
from workers.engine.pipeline import EngineOptions, build_engine
from workers.engine.stages import ModuleSpeechTokens
from workers.model.llm.model import Qwen2LM
from workers.model.llm.ort_decoder import OrtSpeechLM

CPU = torch.device("cpu")


def host(*flags: str) -> HostCPU:
    return HostCPU(model="Test CPU", machine="x86_64", flags=flags, cores=2)


def test_the_setting_defaults_to_auto_and_refuses_other_values(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_settings().llm_precision == "auto"
    monkeypatch.setenv("COSYQ_LLM_PRECISION", "int4")
    with pytest.raises(SettingsError, match=r"(?i)llm_precision"):
        load_settings()
    monkeypatch.setenv("COSYQ_LLM_PRECISION", "int8")
    monkeypatch.setenv("COSYQ_ORT_CACHE_DIR", str(clean_env / "graphs"))
    settings = load_settings()
    assert settings.llm_precision == "int8" and settings.ort_cache_dir == clean_env / "graphs"


def test_explicit_choices_are_kept_and_int8_off_the_cpu_is_refused() -> None:
    assert choose_llm_precision("native", device=CPU, host=host("avx2")).name == "native"
    assert choose_llm_precision("int8", device=CPU, host=host("avx2")).name == "int8"
    with pytest.raises(ModelLoadError, match="CPU with the torch backend only"):
        choose_llm_precision("int8", device=torch.device("cuda"))
    with pytest.raises(ModelLoadError, match="coreml"):
        choose_llm_precision("int8", device=CPU, backend="coreml")


def measurement(**changes: Any) -> Int8Measurement:
    """Figures meeting every bar on any host class, with `changes` applied."""
    good = Int8Measurement(
        host="a test host",
        ratio=0.5,
        baseline="bf16",
        floor_ratio=1.2,
        logp_db=50.0,
        agreement=0.97,
    )
    return dataclasses.replace(good, **changes)


def test_auto_picks_int8_only_where_every_bar_of_the_measurement_holds() -> None:
    zen4, zen3 = host("avx2", "avx512f", "avx512_bf16"), host("avx2", "fma")
    assert (host_class(zen4), host_class(zen3)) == ("avx512_bf16", "avx2")
    table = {"avx512_bf16": measurement(), "avx2": measurement(agreement=0.35)}
    assert choose_llm_precision("auto", device=CPU, host=zen4, measured=table).name == "int8"
    missed = choose_llm_precision("auto", device=CPU, host=zen3, measured=table)
    assert missed.name == "native" and "35% of sampled tokens fp32's (bar 95%)" in missed.reason
    # the speed bar is per class: 0.65x passes on AVX2 (0.7x) and fails on AVX512 (0.6x)
    slow = {"avx512_bf16": measurement(ratio=0.65), "avx2": measurement(ratio=0.65)}
    assert choose_llm_precision("auto", device=CPU, host=zen3, measured=slow).name == "int8"
    refused = choose_llm_precision("auto", device=CPU, host=zen4, measured=slow)
    assert refused.name == "native" and "(bar 0.6x)" in refused.reason
    far = choose_llm_precision(
        "auto", device=CPU, host=zen3, measured={"avx2": measurement(floor_ratio=2.04)}
    )
    assert far.name == "native" and "2.04x its floor (bar 1.5x)" in far.reason
    unmeasured = choose_llm_precision("auto", device=CPU, host=host("neon"), measured=table)
    assert unmeasured.name == "native" and "no int8 measurement" in unmeasured.reason
    gpu = choose_llm_precision("auto", device=torch.device("cuda"), host=zen4, measured=table)
    assert gpu.name == "native"


def test_the_shipped_table_keeps_both_measured_classes_native() -> None:
    for kind in ("avx512_bf16", "avx2"):
        pays, why = MEASURED[kind].verdict(kind)
        assert not pays and "misses" in why


def test_an_int8_engine_synthesizes_and_a_native_one_keeps_torch(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    options = EngineOptions(llm_precision="int8", ort_cache_dir=tmp_path / "graphs")
    engine = build_engine(
        tiny_model_dir, device="cpu", options=options, hash_cache_dir=tmp_path / "h"
    )
    assert isinstance(engine.llm, ModuleSpeechTokens)
    assert isinstance(engine.llm.model, OrtSpeechLM)
    assert engine.llm.model.path.parent == tmp_path / "graphs" and engine.llm.model.path.is_file()
    samples, rate = soundfile.read(tiny_model_dir / "prompt.wav", dtype="float32")
    voice = engine.extract_voice(samples, int(rate), "A prompt.")
    out = engine.synthesize(SynthesisInput(text="Hello there, a short test.", prompt=voice, seed=3))
    assert out.samples.size > 0 and np.isfinite(out.samples).all()
    with capture_logs() as logs:
        session = engine.open_batch_session(4)
    session.close()
    assert isinstance(session, PipelineBatchSession)  # int8 rows batch (test_batch_session_int8)
    assert not [e for e in logs if e["event"] == "batch_session_sequential"]
    native = build_engine(tiny_model_dir, device="cpu", hash_cache_dir=tmp_path / "h")
    assert isinstance(native.llm, ModuleSpeechTokens)
    assert isinstance(native.llm.model, Qwen2LM)
