"""Shared fixtures: a private redis-server per test session, never a Redis we did not start."""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from xdist.scheduler import LoadFileScheduling

from shared.errors import CosyqError
from workers.tools.local_redis import LocalRedis, free_port

__all__ = ["RedisServer", "free_port"]

REPO_ROOT = Path(__file__).resolve().parents[1]
# Test files that share one expensive session fixture made under a file lock (the Core ML
# conversions, ~45 s): one test process runs them all, so no second process sits waiting on it.
SHARED_CONVERSION_FOLDER = "tests/unit/coreml/"
# The files of that folder that use neither session conversion (`converted`, `converted3`):
# they make their own programs, so they are a unit of their own that another process runs
# beside it (the folder as one unit was a run's longest: 1,124 of its 1,800 s on a loaded
# 2-core host). A file listed here that takes a session conversion after all only waits for it.
OWN_CONVERSION_UNIT = "tests/unit/coreml/ (own conversions)"
OWN_CONVERSION_FILES = frozenset(
    SHARED_CONVERSION_FOLDER + name
    for name in (
        "test_batched_programs.py",
        "test_batching.py",
        "test_cache.py",
        "test_cosyvoice3_graphs.py",
        "test_cosyvoice3_llm.py",
        "test_graphs_reference.py",
        "test_llm.py",
    )
)
# The units that take longest (from the durations a run prints), started first so that no long
# file starts last and leaves one test process working alone at the end; every other unit keeps
# xdist's order. A unit missing here only starts later: the list orders, it selects nothing.
SLOW_UNITS_FIRST = (
    # longest first (every unit over 85 s), from a four-process run's file sums (AVX2 Zen 3,
    # 2 cores, other test runs beside it, load 8-12: seconds; the CPU-bound files stretch most
    # under load, and test_errors' and test_openai_sdk's include fronts that timed out)
    SHARED_CONVERSION_FOLDER,  # 686
    "tests/unit/engine/test_batch_session.py",  # 506
    OWN_CONVERSION_UNIT,  # 438
    "tests/integration/voices/test_voices.py",  # 372
    "tests/integration/tools/test_doctor.py",  # 317
    "tests/unit/tools/test_bench.py",  # 300
    "tests/integration/producer/http/test_errors.py",  # 277
    "tests/unit/model/test_flow_stream.py",  # 253
    "tests/unit/model/test_flow_voice_prefix.py",  # 236
    "tests/unit/tools/test_model_cli.py",  # 226
    "tests/unit/tools/test_bench_batch.py",  # 211
    "tests/integration/service/test_stop_stress.py",  # 190
    "tests/unit/tools/test_bench_vox.py",  # 176
    "tests/integration/service/test_pool.py",  # 164
    "tests/integration/service/test_storage_startup.py",  # 146
    "tests/integration/service/test_stop_during_dequeue.py",  # 146
    "tests/integration/producer/http/test_ui_browser.py",  # 145
    "tests/integration/tools/test_soak.py",  # 141
    "tests/unit/engine/test_pipeline.py",  # 139
    "tests/integration/service/test_batch_custody.py",  # 127
    "tests/integration/service/test_startup.py",  # 121
    "tests/integration/service/test_quality_jobs.py",  # 114
    "tests/integration/producer/http/test_openai_sdk.py",  # 111
    "tests/unit/model/test_flow_inference.py",  # 100
    "tests/integration/service/test_webhooks.py",  # 96
    "tests/integration/service/test_storage_lost.py",  # 94
    "tests/integration/producer/http/test_tenants_api.py",  # 92
    "tests/unit/model/test_compile_cache.py",  # 88
    "tests/unit/tools/test_bench_cosyvoice3.py",  # 88
    "tests/integration/producer/http/test_tenant_boundary.py",  # 87
    "tests/integration/service/test_metrics.py",  # 86
)


def _torch_threads_per_process() -> int | None:
    """Cores ÷ test processes under xdist (scripts/test: 2 on 2 cores), else None (torch's own)."""
    processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    return max(1, (os.cpu_count() or 1) // processes) if processes > 1 else None


# Each test process's torch gets its share of the cores: two processes of two OpenMP threads on
# two cores spin against each other (test_pipeline's two seeded tests: 47 s at 2 threads, 9.9 s
# at 1, load 5). Set before any test module imports torch; a worker process started by a test
# still sets its own budget (COSYQ_THREADS) once its model has loaded.
TORCH_THREADS = _torch_threads_per_process()
if TORCH_THREADS is not None:
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, str(TORCH_THREADS))
    # Three test processes (and the workers they start, which inherit this) share two cores: an
    # OpenMP thread that spins while it waits burns a core another process needs (the voices
    # tests' in-process workers at load 5-6: 66.8 CPU s spinning, 17.6 passive). A pool already
    # defaults to PASSIVE (workers/service/host.py); a lone worker and a test process did not.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(autouse=True)
def _torch_threads_stay_shared() -> Iterator[None]:
    """A worker run in this process sets torch's threads to its budget: back to the share."""
    yield
    torch = sys.modules.get("torch")
    if TORCH_THREADS is not None and torch is not None and torch.get_num_threads() != TORCH_THREADS:
        torch.set_num_threads(TORCH_THREADS)


class FilesAndConversionScheduling(LoadFileScheduling):
    """xdist's `--dist loadfile` (a file's tests on one process: they share its module
    fixtures), with the files under SHARED_CONVERSION_FOLDER as two units (those of
    OWN_CONVERSION_FILES, and the rest), the units of SLOW_UNITS_FIRST handed out first, and
    the next unit handed out one test ahead (`_reschedule`)."""

    def _assign_work_unit(self, node: Any) -> None:
        if not getattr(self, "_slow_first", False):
            self._slow_first = True
            rank = {unit: i for i, unit in enumerate(SLOW_UNITS_FIRST)}
            order = sorted(self.workqueue, key=lambda unit: rank.get(unit, len(rank)))
            self.workqueue = OrderedDict((unit, self.workqueue[unit]) for unit in order)
        super()._assign_work_unit(node)

    def _reschedule(self, node: Any) -> None:
        """The next unit once the node holds one test it has not finished, not xdist's two.

        A test process runs a test once it knows the next (its fixtures' teardown depends on
        it), so one held test is one it waits on: the next unit goes out then, one test
        ahead. At two, a unit went out while two tests were still ahead of it, and when one
        of those was long (a one-test file such as test_soak's, a slow last test) it sat
        queued behind it while other processes ran out of work."""
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) <= 1:
            self._assign_work_unit(node)

    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        if not scope.startswith(SHARED_CONVERSION_FOLDER):
            return scope
        return OWN_CONVERSION_UNIT if scope in OWN_CONVERSION_FILES else SHARED_CONVERSION_FOLDER


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadFileScheduling | None:
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own for any other mode
    return FilesAndConversionScheduling(config, log)


def find_reference_dir(
    variable: str = "COSYQ_REFERENCE_DIR", name: str = "cosyvoice2-reference"
) -> Path | None:
    """An official-format reference set: $variable, else ../shared/<name> beside the repo."""
    candidates = [os.environ.get(variable), REPO_ROOT.parent / "shared"]
    for candidate in candidates:
        if not candidate:
            continue
        path = Path(candidate)
        for folder in (path, path / name):
            if (folder / "config.json").is_file():
                return folder
    return None


class RedisServer(LocalRedis):
    """The session's redis-server; a missing binary fails the run with how to install it."""

    def start(self) -> None:
        try:
            super().start()
        except CosyqError as e:
            pytest.fail(str(e))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean database on our own server (safe to flush: we started it)."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    yield redis_server.url
    client.flushdb()
    client.close()


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """The reference set; CI sets COSYQ_REQUIRE_REFERENCE=1 so a missing set fails, not skips."""
    found = find_reference_dir()
    if found is None:
        reason = "CosyVoice 2 reference set not found: set COSYQ_REFERENCE_DIR to its folder"
        if os.environ.get("COSYQ_REQUIRE_REFERENCE") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return found


@pytest.fixture(scope="session")
def reference3_dir() -> Path:
    """The CosyVoice 3 reference set: $COSYQ_REFERENCE3_DIR, else ../shared beside the repo."""
    found = find_reference_dir("COSYQ_REFERENCE3_DIR", "cosyvoice3-reference")
    if found is None:
        reason = "CosyVoice 3 reference set not found: set COSYQ_REFERENCE3_DIR to its folder"
        if os.environ.get("COSYQ_REQUIRE_REFERENCE") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return found


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight model in the official layout, written once per session."""
    from workers.tools.fixtures.tiny import write_tiny_model  # noqa: PLC0415 (torch only when used)

    root = tmp_path_factory.mktemp("tiny-model")
    write_tiny_model(root)
    return root


@pytest.fixture(scope="session")
def tiny3_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight CosyVoice 3 in the official layout, written once per session."""
    from workers.tools.fixtures.tiny3 import write_tiny3_model  # noqa: PLC0415 (torch when used)

    root = tmp_path_factory.mktemp("tiny3-model")
    write_tiny3_model(root)
    return root


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The real torch engine on the tiny model (cpu, fp32), loaded once per session."""
    from workers.engine.pipeline import build_engine  # noqa: PLC0415

    return build_engine(
        tiny_model_dir, device="cpu", hash_cache_dir=tmp_path_factory.mktemp("hashes")
    )
