"""Render (and on macOS install) supervisor configs for K worker slots.

launchd: one LaunchAgent label per slot (`com.cosyq.worker.<slot>`), from the template in
deploy/launchd/. supervisord: one program with `numprocs=K`, from deploy/supervisord/. Both run
`python -m workers.cli run` with this interpreter in the project directory, pass the current
COSYQ_* settings plus COSYQ_POOL_SIZE=K (so each worker takes cores ÷ K threads), and give a
stop timeout above the job timeout so a warm shutdown always completes.
"""

from __future__ import annotations

import os
import plistlib
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.errors import SettingsError
from shared.settings import ENV_PREFIX, Settings
from shared.settings_env import redact_urls
from shared.settings_errors import is_secret

DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy"  # workers/tools/ -> the repo
LAUNCHD_TEMPLATE = DEPLOY_DIR / "launchd" / "cosyq-worker.plist"
SUPERVISORD_TEMPLATE = DEPLOY_DIR / "supervisord" / "cosyq-worker.conf"
DEFAULT_LABEL = "com.cosyq.worker"
STOP_MARGIN_S = 60  # stop timeout = job timeout + this: encode, store and deregister fit in it
SUPERVISORD_STARTSECS = 10  # a worker alive this long counts as started (model loaded, mostly)
PASSED_THROUGH = ("PATH", "HOME", "LANG")


@dataclass(frozen=True)
class DeployPlan:
    """What every rendered config shares."""

    workers: int
    python: str
    workdir: Path
    log_dir: Path
    environment: dict[str, str]
    stop_timeout_s: int

    @classmethod
    def from_settings(
        cls, settings: Settings, *, workers: int, log_dir: Path, workdir: Path | None = None
    ) -> DeployPlan:
        if workers < 1:
            raise SettingsError(f"-n: need at least 1 worker, got {workers}")
        return cls(
            workers=workers,
            python=sys.executable,
            workdir=(workdir or Path.cwd()).resolve(),
            log_dir=log_dir.expanduser().resolve(),
            environment=worker_environment(os.environ, workers),
            stop_timeout_s=settings.job_timeout_s + STOP_MARGIN_S,
        )


def worker_environment(environ: Mapping[str, str], workers: int) -> dict[str, str]:
    """The COSYQ_* settings in force now (already validated), a few basics, and the pool size."""
    env = {k: v for k, v in environ.items() if k.startswith(ENV_PREFIX) or k in PASSED_THROUGH}
    env[ENV_PREFIX + "POOL_SIZE"] = str(workers)
    return dict(sorted(env.items()))


# -- launchd -------------------------------------------------------------------------------


def launchd_label(prefix: str, slot: int) -> str:
    return f"{prefix}.{slot}"


def render_launchd(plan: DeployPlan, slot: int, *, label_prefix: str = DEFAULT_LABEL) -> bytes:
    """One slot's LaunchAgent plist, from deploy/launchd/cosyq-worker.plist."""
    return _render_agent(plan, launchd_label(label_prefix, slot), None)


def render_launchd_pool(plan: DeployPlan, *, label_prefix: str = DEFAULT_LABEL) -> bytes:
    """One agent running `cosyq-worker pool -n K` (one load at a time, granted recycling)."""
    return _render_agent(plan, f"{label_prefix}.pool", ["pool", "-n", str(plan.workers)])


def _render_agent(plan: DeployPlan, label: str, command: list[str] | None) -> bytes:
    with LAUNCHD_TEMPLATE.open("rb") as file:
        agent: dict[str, Any] = plistlib.load(file)
    agent["Label"] = label
    if command is not None:
        agent["ProgramArguments"][3:] = command
    agent["ProgramArguments"][0] = plan.python
    agent["WorkingDirectory"] = str(plan.workdir)
    agent["EnvironmentVariables"] = plan.environment
    agent["ExitTimeOut"] = plan.stop_timeout_s
    agent["StandardOutPath"] = str(plan.log_dir / f"{label}.log")
    agent["StandardErrorPath"] = str(plan.log_dir / f"{label}.err.log")
    return plistlib.dumps(agent, sort_keys=False)


def write_launchd(
    plan: DeployPlan, out_dir: Path, *, label_prefix: str = DEFAULT_LABEL, pool: bool = False
) -> list[Path]:
    """Write one plist per slot, or one for the pool (mode 0600: the environment may hold a
    Redis password)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    if pool:
        path = out_dir / f"{label_prefix}.pool.plist"
        _write_private(path, render_launchd_pool(plan, label_prefix=label_prefix))
        return [path]
    paths = []
    for slot in range(plan.workers):
        path = out_dir / f"{launchd_label(label_prefix, slot)}.plist"
        _write_private(path, render_launchd(plan, slot, label_prefix=label_prefix))
        paths.append(path)
    return paths


def load_launchd(paths: list[Path]) -> None:
    """(Re)load each agent in the user's GUI domain: bootout (if loaded), then bootstrap."""
    domain = f"gui/{os.getuid()}"
    for path in paths:
        subprocess.run(
            ["launchctl", "bootout", domain, str(path)], check=False, capture_output=True
        )
        subprocess.run(["launchctl", "bootstrap", domain, str(path)], check=True)


# -- supervisord ---------------------------------------------------------------------------


def render_supervisord(plan: DeployPlan) -> str:
    """The [program:cosyq-worker] section with numprocs=K, from deploy/supervisord/."""
    text = SUPERVISORD_TEMPLATE.read_text(encoding="utf-8")
    replacements = {
        "__PYTHON__": plan.python,
        "__WORKDIR__": str(plan.workdir),
        "__WORKERS__": str(plan.workers),
        "__STOPWAITSECS__": str(plan.stop_timeout_s),
        "__STARTSECS__": str(SUPERVISORD_STARTSECS),
        "__LOG_DIR__": str(plan.log_dir),
    }
    for placeholder, value in replacements.items():
        text = text.replace(placeholder, value)
    env_line = "environment=" + supervisord_environment(plan.environment)
    lines = [env_line if line.startswith("environment=") else line for line in text.splitlines()]
    return "\n".join(lines) + "\n"


def write_supervisord(plan: DeployPlan, path: Path) -> None:
    """The supervisord config as a file of mode 0600 (it holds the environment's secrets)."""
    _write_private(path, render_supervisord(plan).encode("utf-8"))


def secret_variables(env: Mapping[str, str]) -> list[str]:
    """The names whose values are secrets: a secret setting's (API keys, S3 keys, ...) or a URL
    with credentials in it (the Redis password); such a config is never printed."""
    found = []
    for key, value in env.items():
        name = key.removeprefix(ENV_PREFIX).lower() if key.startswith(ENV_PREFIX) else ""
        field = Settings.model_fields.get(name)
        if (field is not None and is_secret(field)) or redact_urls(value) != value:
            found.append(key)
    return found


def supervisord_environment(env: Mapping[str, str]) -> str:
    """KEY="value",... with supervisord's escaping (% doubled); quotes and newlines refused."""
    pairs = []
    for key, value in env.items():
        if '"' in value or "\n" in value:
            raise SettingsError(f"{key}: a value with quotes or newlines cannot go in supervisord")
        pairs.append(f'{key}="{value.replace("%", "%%")}"')
    return ",".join(pairs)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.chmod(path, 0o600)
