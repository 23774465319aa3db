"""Supervisor configs: restart whatever the exit status, stop warmly, one label per slot."""

from __future__ import annotations

import configparser
import plistlib
import stat
import sys
from pathlib import Path

import pytest

from shared.errors import SettingsError
from shared.settings import load_settings
from workers.cli import main
from workers.tools import deploy


@pytest.fixture
def plan(tmp_path: Path) -> deploy.DeployPlan:
    settings = load_settings(env_file=None, job_timeout_s=300)
    return deploy.DeployPlan.from_settings(
        settings, workers=3, log_dir=tmp_path / "logs", workdir=tmp_path
    )


def test_launchd_renders_one_keepalive_agent_per_slot(
    plan: deploy.DeployPlan, tmp_path: Path
) -> None:
    paths = deploy.write_launchd(plan, tmp_path / "agents")
    assert [p.name for p in paths] == [f"com.cosyq.worker.{i}.plist" for i in range(3)]
    for slot, path in enumerate(paths):
        agent = plistlib.loads(path.read_bytes())
        assert agent["Label"] == f"com.cosyq.worker.{slot}"
        assert agent["KeepAlive"] is True and agent["RunAtLoad"] is True
        assert agent["ExitTimeOut"] == 300 + 60  # above the job timeout
        assert agent["ProcessType"] == "Interactive"
        assert agent["ProgramArguments"] == [sys.executable, "-m", "workers.cli", "run"]
        assert agent["WorkingDirectory"] == str(tmp_path.resolve())
        assert agent["EnvironmentVariables"]["COSYQ_POOL_SIZE"] == "3"
        assert agent["StandardOutPath"].endswith(f"logs/com.cosyq.worker.{slot}.log")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # may hold a Redis password


def test_launchd_pool_mode_renders_one_agent_running_the_pool(
    plan: deploy.DeployPlan, tmp_path: Path
) -> None:
    (path,) = deploy.write_launchd(plan, tmp_path / "agents", pool=True)
    agent = plistlib.loads(path.read_bytes())
    assert agent["Label"] == "com.cosyq.worker.pool"
    assert agent["ProgramArguments"][1:] == ["-m", "workers.cli", "pool", "-n", "3"]
    assert agent["KeepAlive"] is True


def test_launchd_template_is_a_valid_plist_with_the_documented_keys() -> None:
    template = plistlib.loads(deploy.LAUNCHD_TEMPLATE.read_bytes())
    assert {"KeepAlive", "ExitTimeOut", "ProcessType", "EnvironmentVariables"} <= template.keys()
    assert {"StandardOutPath", "StandardErrorPath", "ThrottleInterval"} <= template.keys()


def test_supervisord_renders_numprocs_autorestart_and_a_long_stop_wait(
    plan: deploy.DeployPlan,
) -> None:
    parser = configparser.RawConfigParser()
    parser.read_string(deploy.render_supervisord(plan))
    program = parser["program:cosyq-worker"]
    assert program["numprocs"] == "3"
    assert program["autorestart"] == "true"
    assert program["stopsignal"] == "TERM"
    assert int(program["stopwaitsecs"]) == 300 + 60
    assert program["command"] == f"{sys.executable} -m workers.cli run"
    assert program["process_name"] == "%(program_name)s_%(process_num)02d"
    assert 'COSYQ_POOL_SIZE="3"' in program["environment"]
    assert "__" not in "".join(program.values())  # every placeholder filled


def test_supervisord_environment_escapes_percent_and_refuses_quotes() -> None:
    assert deploy.supervisord_environment({"A": "50%"}) == 'A="50%%"'
    with pytest.raises(SettingsError, match="quotes or newlines"):
        deploy.supervisord_environment({"A": 'say "hi"'})


def test_worker_environment_passes_cosyq_settings_and_sets_the_pool_size() -> None:
    env = deploy.worker_environment(
        {"COSYQ_REDIS_URL": "redis://h", "SECRET_TOKEN": "x", "PATH": "/bin"}, 4
    )
    assert env == {"COSYQ_POOL_SIZE": "4", "COSYQ_REDIS_URL": "redis://h", "PATH": "/bin"}


def test_deploy_command_writes_supervisord_file(tmp_path: Path) -> None:
    out = tmp_path / "cosyq.conf"
    assert main(["deploy", "supervisord", "-n", "2", "--out", str(out)]) == 0
    assert "numprocs=2" in out.read_text()


def test_deploy_refuses_zero_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "launchd", "-n", "0", "--out", str(tmp_path)]) == 2
    assert "at least 1 worker" in capsys.readouterr().err


def test_a_supervisord_file_with_secrets_is_private_and_never_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The config carries the environment, the Redis password and the API keys with it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COSYQ_REDIS_URL", "redis://alice:redis-deploy-3K@127.0.0.1:6379/0")
    monkeypatch.setenv("COSYQ_API_KEYS", "acme:api-deploy-7M")
    out = tmp_path / "cosyq.conf"
    assert main(["deploy", "supervisord", "-n", "2", "--out", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "redis-deploy-3K" in out.read_text()  # the file is the config: it must work
    assert main(["deploy", "supervisord", "-n", "2"]) == 2
    printed = capsys.readouterr()
    assert "COSYQ_API_KEYS" in printed.err and "--out" in printed.err
    for secret in ("redis-deploy-3K", "api-deploy-7M"):
        assert secret not in printed.out + printed.err


def test_a_supervisord_config_without_secrets_still_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COSYQ_REDIS_URL", "redis://127.0.0.1:6379/0")
    for name in ("COSYQ_API_KEYS", "COSYQ_OPERATOR_KEYS", "COSYQ_S3_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert main(["deploy", "supervisord", "-n", "2"]) == 0
    assert "numprocs=2" in capsys.readouterr().out
