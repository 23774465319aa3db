"""The model tests' one upstream-format cosyvoice2.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.tools.fixtures.tiny_config import PUBLISHED_SPEC, render_yaml


@pytest.fixture
def published_yaml(tmp_path: Path) -> Path:
    """CosyVoice2-0.5B's cosyvoice2.yaml at its published sizes, from the tiny model's template
    (so the format is declared once, where `cosyq-worker model init-tiny` writes it)."""
    path = tmp_path / "cosyvoice2.yaml"
    path.write_text(render_yaml(PUBLISHED_SPEC))
    return path


@pytest.fixture(params=["blocked", "fused"])
def bf16_attention_kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a bf16 CPU test under each attention kernel a host may pick (blocked on AVX512-BF16,
    the fused flash kernel on AMX), whatever this host picks."""
    from workers.model import cpu_attention  # noqa: PLC0415

    kernel: str = request.param
    monkeypatch.setattr(cpu_attention, "blocked_attention_pays", lambda: kernel == "blocked")
    return kernel
