"""A worker's start imports only what every worker needs (issue 46): the levels' meter and
filters (pyloudnorm, scipy), onnxruntime, torch, Core ML and the HTTP front's libraries are
imported where a job or an engine first uses them, never by `cosyq-worker run`'s own modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WORKER_START = (
    "workers.cli",
    "workers.service.commands",  # `cosyq-worker run` and `pool`
    "workers.worker",
    "workers.tasks",
    "workers.service.batch_runner",
    "workers.service.quality",
    "workers.engine.loudness",
    "workers.engine.prompt_models",
)
HEAVY = ("scipy", "pyloudnorm", "onnxruntime", "torch", "coremltools", "boto3", "fastapi")


def test_a_worker_start_leaves_the_heavy_modules_out() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {WORKER_START!r}: importlib.import_module(name)\n"
        "importlib.import_module('workers.cli').build_parser()\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


def test_the_levels_still_load_on_first_use() -> None:
    code = (
        "import sys, numpy as np\n"
        "from workers.engine.quality import measure_audio\n"
        "t = np.arange(24000) / 24000\n"
        "m = measure_audio((0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 24000)\n"
        "print(round(m.loudness_lufs, 1), round(m.true_peak_dbtp, 1), 'scipy' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    lufs, peak, loaded = out.stdout.split()
    assert -10.0 < float(lufs) < -5.0 and float(peak) == -6.0 and loaded == "True"


def test_a_pool_start_leaves_the_worker_and_the_client_out() -> None:
    """`cosyq-worker pool` (and every `producer.` module a worker imports) started 0.1-0.2 CPU s
    heavier: the worker's modules, and the whole client through the `producer` package."""
    code = (
        "import json, sys\n"
        "import workers.service.commands\n"
        "names = ('workers.worker', 'producer.client', 'producer.documents', 'producer.cancel')\n"
        "print(json.dumps([m for m in names if m in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


def test_the_producer_package_still_exports_each_name() -> None:
    import producer  # noqa: PLC0415 (the package's names are loaded on first use)
    from producer.client import CosyqClient  # noqa: PLC0415

    assert all(hasattr(producer, name) for name in producer.__all__)
    assert producer.CosyqClient is CosyqClient
