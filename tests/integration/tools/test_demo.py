"""The README's main command, `./scripts/demo` (`python -m workers.tools.demo`), end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(300)
def test_demo_writes_every_file_and_prints_the_summary(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    out = tmp_path / "demo-output"
    done = subprocess.run(
        [sys.executable, "-m", "workers.tools.demo", "--out", str(out), "-n", "2"],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cosyq submit" in done.stdout and "audio written" in done.stdout
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok"] * 7
    for record in records:
        result = record["result"]
        path = Path(result["uri"].removeprefix("file://"))
        assert path.is_file() and path.is_relative_to(out / "demo")
        info = soundfile.info(str(path))
        assert info.samplerate == result["sample_rate"]
        assert abs(info.frames / info.samplerate - result["duration_s"]) < 0.01
    assert {r["result"]["format"] for r in records} == {"wav", "flac", "ogg"}
    assert "Traceback" not in (out / "worker.log").read_text()
