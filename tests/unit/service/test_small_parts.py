"""Control protocol, failure classification, retry backoff, pool backoff, engine loading."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from rq.timeouts import JobTimeoutException

from shared.errors import (
    InvalidRequestError,
    ModelLoadError,
    StorageError,
    StorageUnavailableError,
    TransientError,
)
from shared.jobs import retry_intervals
from shared.settings import load_settings
from workers.service import control
from workers.service.engine_loading import import_engine_factory, load_engine
from workers.service.failures import classify
from workers.service.pool import PoolConfig

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_control_lines_round_trip_and_survive_partial_reads() -> None:
    reader = control.LineReader()
    data = control.encode(control.LOADING, "w1") + control.encode(control.FAILED, "bad\nthing")
    first = reader.feed(data[:5])
    rest = reader.feed(data[5:] + b"garbage line\n")
    assert first == []
    assert rest == [
        control.ControlMessage(control.LOADING, "w1"),
        control.ControlMessage(control.FAILED, "bad thing"),
    ]
    with pytest.raises(ValueError, match="unknown control event"):
        control.encode("shutdown")


@pytest.mark.parametrize(
    ("error", "kind", "retryable"),
    [
        (InvalidRequestError("text: too long"), "invalid_request", False),
        (TransientError("s3 down"), "transient", True),
        (StorageUnavailableError("cannot write s3://b/k: SlowDown (HTTP 503)"), "transient", True),
        (StorageError("cannot write /srv/out/a.wav: Read-only file system"), "storage", False),
        (redis.ConnectionError("gone"), "transient", True),
        (JobTimeoutException("alarm"), "transient", True),
        (KeyError("oops"), "internal", False),
    ],
)
def test_classification(error: BaseException, kind: str, retryable: bool) -> None:
    classified = classify(error, timeout_s=30)
    assert (classified.kind, classified.retryable) == (kind, retryable)
    assert classified.wants_traceback == (kind == "internal")


def test_timeout_message_names_the_limit_and_long_messages_are_cut() -> None:
    assert classify(JobTimeoutException("x"), timeout_s=30).message == "job timed out after 30 s"
    assert classify(classify_long()).message.endswith("...")


def classify_long() -> Exception:
    return RuntimeError("x" * 2000)


def test_backoff_doubles_in_whole_seconds() -> None:
    assert retry_intervals(3, 5.0) == [5, 10, 20]
    assert retry_intervals(0, 5.0) == []
    assert retry_intervals(2, 0.0) == [0, 0]


def test_pool_backoff_is_exponential_and_capped() -> None:
    config = PoolConfig(size=2, backoff_initial_s=1.0, backoff_max_s=5.0)
    assert [config.backoff_s(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_engine_setting_errors_are_model_load_errors() -> None:
    with pytest.raises(ModelLoadError, match=r"must look like 'package\.module:factory'"):
        import_engine_factory("workers.service.default_engine.engine_from_settings")
    with pytest.raises(ModelLoadError, match="cannot import no_such_module"):
        import_engine_factory("no_such_module:load")
    with pytest.raises(ModelLoadError, match="has no callable 'nope'"):
        import_engine_factory("workers.service.engine_loading:nope")


def test_load_engine_times_load_and_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTENGINE_LOAD_S", "0.3")  # slow_load's warm-up sleeps 0.1 s
    settings = load_settings(env_file=None, engine="tests.doubles.engines:slow_load")
    loaded = load_engine(settings)
    assert loaded.engine.identity.name == "test-slow-load"
    assert 0.3 <= loaded.load_s < 0.3 + 5 and 0.1 <= loaded.warm_up_s < 0.1 + 5
    assert getattr(loaded.engine, "warmed_up", False)
    broken = load_settings(env_file=None, engine="tests.doubles.engines:broken")
    with pytest.raises(ModelLoadError, match="RuntimeError: test engine crashed while loading"):
        load_engine(broken)


def test_an_internal_reason_is_its_type_and_first_line_only() -> None:
    error = ValueError('Parameter validation failed:\nInvalid bucket name "B_": must match "^x"')
    assert classify(error).message == "ValueError: Parameter validation failed:"
    long = classify(RuntimeError("y" * 1000)).message
    assert len(long) == 200 and long.endswith("...")


@pytest.mark.parametrize(
    "error",
    [
        ConnectionError('could not reach "http://minio:pw-SECRET-9@10.0.0.5:9000/bucket"'),
        RuntimeError("redis://alice:pw-SECRET-9@10.0.0.5:6379/0 went away"),
        StorageUnavailableError("cannot write: https://h/o?X-Amz-Signature=pw-SECRET-9"),
    ],
)
def test_a_failure_reason_quotes_no_url_credentials(error: BaseException) -> None:
    """The reason is stored in Redis and shown by the API, the job's webhook and `cosyq
    failed`: no password, and no user name either (the tenant reads it)."""
    message = classify(error).message
    assert "pw-SECRET-9" not in message and "***" in message
    assert "minio" not in message and "alice" not in message


FIRST_USE = ("pyloudnorm", "scipy.signal", "scipy.ndimage")
LOAD_AND_LIST = (
    "import sys\n"
    "from shared.settings import load_settings\n"
    "from workers.service.engine_loading import load_engine\n"
    "settings = load_settings(env_file=None, engine='tests.doubles.engines:fast',"
    " quality_import_at_start=sys.argv[1] == 'on')\n"
    f"before = [name in sys.modules for name in {FIRST_USE!r}]\n"
    "loaded = load_engine(settings)\n"
    f"print(before, [name in sys.modules for name in {FIRST_USE!r}], loaded.imports_s > 0)\n"
)


@pytest.mark.parametrize("setting", ["on", "off"])
def test_a_worker_imports_the_loudness_measures_before_ready_unless_told_not(
    setting: str,
) -> None:
    """A fresh interpreter (this one may have them already): COSYQ_QUALITY_IMPORT_AT_START on,
    the engine's load brings in what a first job's loudness measure would import."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    done = subprocess.run(
        [sys.executable, "-c", LOAD_AND_LIST, setting],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    on = setting == "on"
    assert done.stdout.split("\n")[-2] == f"{[False] * 3} {[on] * 3} {on}"
