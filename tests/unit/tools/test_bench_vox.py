"""`cosyq-worker bench vox` on the tiny model: vox really converts and runs it beside cosyq, and
the table and the JSON carry every engine's figures (all positive) and the host they came from.
Without vox-tts the end-to-end tests skip, saying so; the command then exits non-zero with the
line that says how to install it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workers.tools.bench.vox_cli import as_json, format_table
from workers.tools.bench.vox_models import (
    INSTALL_LINE,
    VoxMissingError,
    cache_key,
    convert,
    import_vox,
)
from workers.tools.bench.vox_side import SideBySide, SideBySideOptions, run_side_by_side
from workers.tools.fixtures.tiny import write_tiny_model

pytestmark = pytest.mark.timeout(900)


def vox_missing() -> str | None:
    try:
        import_vox()
    except VoxMissingError:
        return "vox-tts is not installed (pip install vox-tts==0.19.5)"
    return None


needs_vox = pytest.mark.skipif(vox_missing() is not None, reason=str(vox_missing()))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("vox") / "tiny").root


@pytest.fixture(scope="module")
def side_by_side(tiny: Path) -> SideBySide:
    threads = torch.get_num_threads()
    # What is checked is that every engine's figures are there and sane, not how fast: one
    # thread (no OpenMP spinning against the other test processes) and 2 runs (best <= median
    # still compares two), not the command's 2 threads and 3 runs.
    options = SideBySideOptions(
        model_dir=tiny,
        cache_dir=tiny.parent / "cache",
        hash_cache_dir=tiny.parent / "hashes",
        threads=1,
        runs=2,
    )
    try:
        return run_side_by_side(options)
    finally:
        torch.set_num_threads(threads)


@needs_vox
@pytest.mark.slow
def test_the_json_has_every_engine_with_positive_figures(side_by_side: SideBySide) -> None:
    doc = json.loads(json.dumps(as_json(side_by_side)))
    native = f"cosyq {doc['cosyq_native_dtype']}"  # fp32 without AMX / AVX512-BF16
    assert [e["engine"] for e in doc["engines"]] == ["vox q8", "vox bf16", native, "cosyq int8"]
    runs = doc["runs"]
    for engine in doc["engines"]:
        assert len(engine["ms_per_token"]) == len(engine["tokens"]) == runs
        assert all(ms > 0 for ms in engine["ms_per_token"]), engine
        assert all(count > 0 for count in engine["tokens"]), engine
        assert 0 < engine["best_ms_per_token"] <= engine["median_ms_per_token"]
    cosyq = [e for e in doc["engines"] if e["engine"].startswith("cosyq")]
    assert all(set(e["tokens"]) == {doc["speech_tokens"]} for e in cosyq)  # forced to vox q8's
    assert len(doc["ratios"]) == 4
    assert all(r["best"] > 0 and r["median"] > 0 for r in doc["ratios"])
    assert isinstance(doc["host"]["flags"], list) and doc["host"]["model"]
    assert doc["load_average"]["before"] >= 0 and doc["load_average"]["after"] >= 0
    assert doc["vox_version"] == "0.19.5"
    assert {m["precision"] for m in doc["vox_models"]} == {"q8", "bf16"}


@needs_vox
@pytest.mark.slow
def test_the_table_names_each_engine_the_ratios_and_the_host(side_by_side: SideBySide) -> None:
    table = format_table(side_by_side)
    for engine in (t.label for t in side_by_side.timings):
        row = next(line for line in table.splitlines() if line.startswith(engine))
        best = float(row.split()[3])
        assert best > 0, row
    assert "ratio cosyq / vox" in table
    assert "verdict: cosyq's fastest" in table
    assert side_by_side.host.line() in table
    assert "load average (1 min)" in table
    assert "measure: LLM stage time per speech token, prefill included" in table


@needs_vox
@pytest.mark.slow
def test_a_second_conversion_comes_from_the_cache(side_by_side: SideBySide, tiny: Path) -> None:
    first = side_by_side.conversions[0]
    again = convert(tiny, side_by_side.options.cache_dir / "vox", first.precision)
    assert again.path == first.path and again.converted_s == 0.0
    assert first.path.parent.name == cache_key(tiny, side_by_side.vox_version)


@needs_vox
@pytest.mark.slow
def test_the_command_prints_json_alone_on_stdout(side_by_side: SideBySide) -> None:
    # on the module's tiny model and caches: vox's conversions and cosyq's int8 graphs are
    # made once in this file (a second conversion from the cache is checked above)
    options = side_by_side.options
    folders = ["--model-dir", str(options.model_dir), "--cache-dir", str(options.cache_dir)]
    folders += ["--hash-cache-dir", str(options.hash_cache_dir)]
    # one thread, as the fixture's run: the JSON's form is checked, not the speed (2 threads:
    # 8.5 CPU s, 1 thread: 6.5)
    argv = ["bench", "vox", "--runs", "1", "--threads", "1", "--json", *folders]
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)  # the engines' log lines went to stderr
    assert (doc["runs"], doc["threads"]) == (1, 1) and len(doc["engines"]) == 4
    assert all(e["best_ms_per_token"] > 0 for e in doc["engines"])
    assert "vox q8 made" in done.stderr


def test_without_vox_the_command_exits_non_zero_with_the_install_line() -> None:
    code = (
        "import sys; sys.modules['vox'] = None\n"  # what `import vox` meets when not installed
        "from workers.cli import main\n"
        "sys.exit(main(['bench', 'vox']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [INSTALL_LINE]
    assert "pip install vox-tts==0.19.5" in INSTALL_LINE
