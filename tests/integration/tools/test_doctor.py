"""`cosyq-worker doctor` on Linux: a real redis-server we start, the tiny model written by
`cosyq-worker model init-tiny`, file storage in a scratch folder.

Ready host: exit 0, every row present, Core ML runtime rows skipped with the reason, torch rows
measured. Each broken piece (a damaged model file, unwritable storage, Redis unreachable, a
wrong Redis password) exits 1 with the cause named in its row.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Worker

from shared.settings import Settings
from shared.start_failures import record_start_failure
from tests.conftest import free_port
from tests.doubles.harness import REPO_ROOT
from tests.doubles.redis_servers import secured_redis
from tests.integration.service.test_cache_folders import as_a_service_user
from workers.cli import main as worker_cli
from workers.tools.doctor import coreml_run
from workers.tools.doctor.checks import ROW_NAMES
from workers.tools.doctor.host_checks import CACHE_FOLDERS_ROW
from workers.tools.doctor.model_checks import CACHE
from workers.tools.doctor.rows import COREML_ONLY_ON_MACOS
from workers.tools.doctor.stack_checks import COREML_RUNTIME_ROW

EXPECTED_ROWS = {group: list(names) for group, names in ROW_NAMES.items()}
COREML_RUNTIME_ROWS = [COREML_RUNTIME_ROW, CACHE, *coreml_run.ROW_NAMES]  # none runs on Linux


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("doctor") / "tiny"
    with contextlib.redirect_stdout(io.StringIO()):
        assert worker_cli(["model", "init-tiny", str(root)]) == 0
    return root


@pytest.fixture
def host_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_url: str) -> Path:
    """A ready host: our redis-server, writable file storage, one thread, no stray settings."""
    for name in list(os.environ):
        if name.upper().startswith("COSYQ_") and name.lower()[6:] in Settings.model_fields:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no .env
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "audio").as_uri())
    monkeypatch.setenv("COSYQ_HASH_CACHE_DIR", str(tmp_path / "hashes"))
    monkeypatch.setenv("COSYQ_COREML_CACHE_DIR", str(tmp_path / "coreml-cache"))
    monkeypatch.setenv("COSYQ_THREADS", "1")  # two spinning threads crawl on a loaded machine
    monkeypatch.setenv("COSYQ_REDIS_CONNECT_TIMEOUT_S", "2")
    return tmp_path


def doctor(*args: str) -> tuple[int, dict[str, Any], dict[str, dict[str, Any]]]:
    """Run `cosyq-worker doctor --json ARGS`: (exit status, report, rows by name)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = worker_cli(["doctor", "--json", *args])
    report = json.loads(out.getvalue())
    return status, report, {row["name"]: row for row in report["rows"]}


def test_a_ready_linux_host_passes_with_every_row(host_env: Path, tiny_dir: Path) -> None:
    status, report, rows = doctor("--model-dir", str(tiny_dir), "--runs", "1", "--tokens", "20")
    failed = {name: row["detail"] for name, row in rows.items() if row["status"] == "fail"}
    assert status == 0, failed
    assert report["exit_status"] == 0
    assert len(report["load_average"]) == 3 and report["cpus"] >= 1
    by_group: dict[str, list[str]] = {}
    for row in report["rows"]:
        by_group.setdefault(row["group"], []).append(row["name"])
    assert by_group == EXPECTED_ROWS
    for name in COREML_RUNTIME_ROWS:
        assert rows[name]["status"] == "skipped", name
        assert rows[name]["detail"] == COREML_ONLY_ON_MACOS
    assert rows["torch-mps fp32"]["status"] == "skipped"
    assert "macOS only" in rows["torch-mps fp32"]["detail"]
    reference = rows["torch-cpu fp32 (reference)"]
    assert reference["status"] == "ok"
    figures = reference["figures"]
    assert figures["load_s"] > 0 and figures["mean_inference_s"] > 0
    assert figures["peak_rss_gb"] > 0
    assert [s["stage"] for s in figures["stages"]] == ["LLM step", "flow", "HiFT"]
    assert all(s["seconds"] > 0 and s["max_abs_error"] == 0 for s in figures["stages"])
    for name in ("Redis", "storage writable", "checkpoint hashes"):
        assert rows[name]["status"] == "ok", rows[name]
    assert "Redis 7" in rows["Redis"]["detail"] or "Redis " in rows["Redis"]["detail"]
    assert rows["checkpoint hashes"]["figures"]["sha256"].keys() == {"llm.pt", "flow.pt", "hift.pt"}


def test_quick_skips_the_runs_and_prints_a_table(host_env: Path, tiny_dir: Path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = worker_cli(["doctor", "--model-dir", str(tiny_dir), "--quick"])
    text = out.getvalue()
    assert status == 0, text
    assert "✓" in text and "skipped: --quick" in text
    assert f"skipped: {COREML_ONLY_ON_MACOS}" in text
    assert "every required check passed" in text
    _, _, rows = doctor("--model-dir", str(tiny_dir), "--quick")
    assert all(rows[name]["status"] == "skipped" for name in EXPECTED_ROWS["run"])
    assert rows["torch-cpu fp32 (reference)"]["detail"] == "--quick"


@pytest.mark.parametrize("form", [(), ("--json",)], ids=["table", "json"])
def test_quick_into_a_closed_stdout_exits_141(
    host_env: Path, tiny_dir: Path, form: tuple[str, ...]
) -> None:
    """`doctor --quick | head`: the reader is gone before the report is written (issue 45)."""
    worker_cli_path = str(Path(sys.executable).parent / "cosyq-worker")
    argv = [worker_cli_path, "doctor", *form, "--quick", "--model-dir", str(tiny_dir)]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            argv,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr  # every check passed; the output was cut off
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_a_damaged_checkpoint_is_named(host_env: Path, tiny_dir: Path) -> None:
    damaged = host_env / "damaged"
    shutil.copytree(tiny_dir, damaged)
    (damaged / "flow.pt").write_bytes(b"not a checkpoint")
    status, _, rows = doctor("--model-dir", str(damaged), "--quick")
    assert status == 1
    layout = rows["layout and strict checkpoint load"]
    assert layout["status"] == "fail"
    assert str(damaged / "flow.pt") in layout["detail"]
    assert layout["hint"]
    assert rows["checkpoint hashes"]["status"] == "skipped"


def test_a_missing_model_file_is_named(host_env: Path, tiny_dir: Path) -> None:
    damaged = host_env / "incomplete"
    shutil.copytree(tiny_dir, damaged)
    (damaged / "CosyVoice-BlankEN" / "vocab.json").unlink()
    status, _, rows = doctor("--model-dir", str(damaged), "--quick")
    assert status == 1
    assert "CosyVoice-BlankEN/vocab.json" in rows["layout and strict checkpoint load"]["detail"]


def test_an_unwritable_hash_cache_is_one_row_and_the_model_is_still_checked(
    host_env: Path, tiny_dir: Path
) -> None:
    """As a service user (root without its override of file modes): a 0555 hash cache was a
    bare PermissionError traceback from the model load; now the row `run` and `pool` refuse to
    start for, naming the folder and the setting, and every other check runs."""
    folder = host_env / "hashes"
    folder.mkdir(mode=0o555)
    folder.chmod(0o555)
    command = [sys.executable, "-m", "workers.cli", "doctor", "--json", "--quick"]
    done = subprocess.run(
        as_a_service_user([*command, "--model-dir", str(tiny_dir)]),
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},  # this checkout's code
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)["rows"]}
    cache = rows[CACHE_FOLDERS_ROW]
    assert cache["status"] == "fail"
    assert cache["detail"] == (
        f"COSYQ_HASH_CACHE_DIR={folder} cannot be written by this process (Permission denied):"
        " a worker keeps checkpoint hashes there"
    )
    assert "COSYQ_HASH_CACHE_DIR" in cache["hint"]
    failed = [name for name, row in rows.items() if row["status"] == "fail"]
    assert failed == [CACHE_FOLDERS_ROW]  # the model loaded and was hashed, uncached
    assert rows["checkpoint hashes"]["figures"]["sha256"].keys() == {"llm.pt", "flow.pt", "hift.pt"}
    assert list(folder.iterdir()) == []


def test_unwritable_storage_fails(
    host_env: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = host_env / "a-file"
    blocker.write_text("a file where the storage folder should be")
    monkeypatch.setenv("COSYQ_STORAGE_URL", (blocker / "audio").as_uri())
    status, _, rows = doctor("--model-dir", str(tiny_dir), "--quick")
    assert status == 1
    storage = rows["storage writable"]
    assert storage["status"] == "fail"
    assert "a-file" in storage["detail"] and "permanent" in storage["detail"]
    assert "COSYQ_STORAGE_URL" in storage["hint"]
    assert rows["Redis"]["status"] == "ok"


def test_unreachable_redis_fails(
    host_env: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()  # nothing listens there
    monkeypatch.setenv("COSYQ_REDIS_URL", f"redis://127.0.0.1:{port}/0")
    status, _, rows = doctor("--model-dir", str(tiny_dir), "--quick")
    assert status == 1
    assert rows["Redis"]["status"] == "fail"
    assert f"cannot reach Redis at redis://127.0.0.1:{port}/0" in rows["Redis"]["detail"]
    assert rows["queues and workers"]["status"] == "skipped"
    assert rows["storage writable"]["status"] == "ok"


def test_a_wrong_redis_password_is_named_and_masked(
    host_env: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with secured_redis(host_env) as server:
        monkeypatch.setenv("COSYQ_REDIS_URL", server.url("alice", "not it"))
        status, report, rows = doctor("--model-dir", str(tiny_dir), "--quick")
    assert status == 1
    detail = rows["Redis"]["detail"]
    assert rows["Redis"]["status"] == "fail"
    assert "authentication failed" in detail and "alice:***@" in detail
    assert "not it" not in json.dumps(report) and "not%20it" not in json.dumps(report)
    assert "password" in rows["Redis"]["hint"]


def test_the_right_password_is_reported_masked(
    host_env: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with secured_redis(host_env) as server:
        monkeypatch.setenv("COSYQ_REDIS_URL", server.url("alice", "s3cret pass"))
        status, report, rows = doctor("--model-dir", str(tiny_dir), "--quick")
    assert status == 0, rows["Redis"]
    assert "authenticated as alice (password ***)" in rows["Redis"]["detail"]
    assert "s3cret" not in json.dumps(report)


def test_invalid_settings_fail_with_every_row_present(
    host_env: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COSYQ_POOL_SIZE", "zero")
    status, report, rows = doctor("--model-dir", str(tiny_dir))
    assert status == 1
    assert rows["settings"]["status"] == "fail" and "COSYQ_POOL_SIZE" in rows["settings"]["detail"]
    by_group: dict[str, list[str]] = {}
    for row in report["rows"]:
        by_group.setdefault(row["group"], []).append(row["name"])
    assert by_group == EXPECTED_ROWS
    for group in ("host", "services", "model", "run"):
        for name in EXPECTED_ROWS[group][1 if group == "host" else 0 :]:
            assert rows[name] == {**rows[name], "status": "skipped"}, name
    assert rows["torch"]["status"] == "ok"  # the stack needs no settings


def test_workers_listening_and_slots_that_cannot_start_are_reported(
    host_env: Path, tiny_dir: Path, redis_url: str
) -> None:
    connection = redis.Redis.from_url(redis_url)
    worker = Worker(["cosyq-default"], connection=connection, name="doctor-test-worker")
    worker.register_birth()
    try:
        _, _, rows = doctor("--model-dir", str(tiny_dir), "--quick")
        queues = rows["queues and workers"]
        assert queues["status"] == "ok" and "1 worker(s) listening" in queues["detail"]
        assert queues["figures"]["workers"] == ["doctor-test-worker"]
        record_start_failure(
            connection,
            host="mac-a",
            slot="1",
            worker="w1",
            reason="storage file:///x is not usable",
            ttl_s=60,
            count=True,
        )
        status, _, rows = doctor("--model-dir", str(tiny_dir), "--quick")
    finally:
        worker.register_death()
        connection.close()
    queues = rows["queues and workers"]
    assert status == 0  # advice: the host itself is ready
    assert queues["status"] == "fail" and not queues["required"]
    assert "mac-a:1: storage file:///x is not usable" in queues["detail"]


def test_an_evicting_redis_is_advice(host_env: Path, tiny_dir: Path, redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    previous = connection.config_get("maxmemory-policy")["maxmemory-policy"]
    previous = previous.decode() if isinstance(previous, bytes) else str(previous)
    connection.config_set("maxmemory-policy", "allkeys-lru")
    try:
        status, _, rows = doctor("--model-dir", str(tiny_dir), "--quick")
    finally:
        connection.config_set("maxmemory-policy", previous)
        connection.close()
    assert status == 0
    assert rows["Redis"]["status"] == "fail" and not rows["Redis"]["required"]
    assert "maxmemory-policy allkeys-lru" in rows["Redis"]["detail"]
    assert "noeviction" in rows["Redis"]["hint"]
